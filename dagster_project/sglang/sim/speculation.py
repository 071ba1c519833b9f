"""How the simulator prices a speculative setting (steps/top-k/draft tokens, or off): the acceptance it gets and
what its decode step costs, so that `dflash tune` can measure whether MTP pays at a concurrency.

**Acceptance.** `accept_probs` are P(k drafts accepted) per verify pass, measured at the chain they have room
for (len − 1 steps, top-k 1): the default 0.2/0.2/0.2/0.4 is accept length 2.8 at the model card's 3/1/4. They
are used as given at that chain. Any other setting keeps the same *per-draft* acceptance p: a draft counts only
if every one before it did, so a chain of n drafts accepts k with probability p^k (1 − p) (k < n), all n with
p^n, and p is the value whose chain of the measured length has the measured mean. A tree of w candidates per
level catches a share `TOPK_CATCH` of the remaining misses with each further candidate:
p_w = 1 − (1 − p) (1 − TOPK_CATCH)^(w − 1). Both are assumptions (stated in docs/OPERATIONS.md), not
measurements: the chain model is EAGLE's acceptance-by-position picture, the top-k share is a guess that a GPU
run replaces.

**Cost.** `decode_step_s` and `decode_step_growth` describe the server as the model card launches it (3/1/4):
a step of b running requests takes T(b) = s (1 + g (b − 1)) = F + b R, a fixed part F = s (1 − g) (reading the
weights, the target's and the drafts') and a part R = s g per running request (its KV and state reads and its
tokens' compute). Another setting changes both: each of its steps + 1 MTP forwards reads the MTP layer and the
LM head (`DRAFT_PASS_COST` of the target's weights) and runs top-k tokens per request; its verify pass runs
draft-tokens tokens per request, each past the first costing `VERIFY_TOKEN_COST` of a request's share. Without
MTP a step is one token per request and no MTP forward. So MTP buys accept-length tokens per step for a step
that grows faster with the batch, and at saturation it can stop paying. Both constants are fitted to the GPU
profiles' roofline curves (`sglang.profiles`, docs/GPU_PROFILES.md), which compute every setting's step from
the hardware and the model's shapes: a test keeps the two within a few percent.
"""

from __future__ import annotations

from collections.abc import Sequence

from dagster_project.sglang.speculative import RECIPE, SpecSetting

# One MTP forward (the MTP layer and the LM head, 248,320 x 5,120: 1.7 B of the 25.6 B weights streamed per
# target forward) in shares of a plain decode step's fixed part: fitted to the roofline profiles, where MTP off
# runs at 0.81 of the 3/1/4 step's fixed part and each step more adds 4.7%.
DRAFT_PASS_COST = 0.0575
# A verified token past a request's first, in shares of that request's per-step cost (its KV and state reads
# happen once per pass; the state writes and compute per token): fitted to the roofline profiles, where a
# request's share without MTP is 0.43 of its share under 3/1/4.
VERIFY_TOKEN_COST = 0.36
# Share of the misses of the best candidate that a further top-k candidate catches: an assumption.
TOPK_CATCH = 0.4


def per_draft_acceptance(target: float, drafts: int) -> float:
    """p such that a chain of `drafts` drafts, each accepted with p given its predecessors, accepts `target` drafts
    on average: p + p^2 + ... + p^drafts = target (bisection: the sum grows with p)."""
    if drafts < 1 or target <= 0:
        return 0.0
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        if sum(middle**k for k in range(1, drafts + 1)) < target:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def accept_probs(measured: Sequence[float], setting: SpecSetting) -> tuple[float, ...]:
    """P(k drafts accepted), k = 0..depth, per verify pass under `setting`, from acceptance `measured` at its
    own chain (returned as is for that chain)."""
    if setting.topk == 1 and setting.steps == len(measured) - 1:
        return tuple(measured)
    p = per_draft_acceptance(sum(k * q for k, q in enumerate(measured)), len(measured) - 1)
    p = 1 - (1 - p) * (1 - TOPK_CATCH) ** (setting.width - 1)
    depth = setting.depth
    return tuple(p**k * (1 - p) for k in range(depth)) + (p**depth,)


def _fixed_share(setting: SpecSetting | None) -> float:
    """The fixed part of a step (weights read) relative to a plain decode step's."""
    return 1 + ((setting.steps + 1) * DRAFT_PASS_COST if setting is not None else 0.0)


def _per_request_share(setting: SpecSetting | None) -> float:
    """The per-request part of a step relative to a plain decode step's: the verified tokens and the drafts."""
    if setting is None:
        return 1.0
    verify = 1 + (setting.draft_tokens - 1) * VERIFY_TOKEN_COST
    return verify + (setting.steps + 1) * DRAFT_PASS_COST * setting.topk


def step_factor(setting: SpecSetting | None, growth: float, batch: int) -> float:
    """A decode step of `batch` running requests under `setting` (None: MTP off), in units of the decode step
    of one request under the model card's 3/1/4: (1 + growth x (batch − 1)) for that recipe itself."""
    fixed = (1 - growth) * _fixed_share(setting) / _fixed_share(RECIPE)
    per_request = growth * _per_request_share(setting) / _per_request_share(RECIPE)
    return fixed + batch * per_request


def recipe_step(setting: SpecSetting | None, step_1: float, growth: float) -> tuple[float, float]:
    """(decode_step_s, decode_step_growth) under 3/1/4 that `step_factor` prices `setting` (None: off) at, given
    the step of `setting` itself: `step_1` at one running request, `growth` more per extra one (a curve computed
    or measured under that setting, e.g. a GPU profile's). The inverse of `step_factor` for a linear step."""
    fixed = step_1 * (1 - growth) * _fixed_share(RECIPE) / _fixed_share(setting)
    per_request = step_1 * growth * _per_request_share(RECIPE) / _per_request_share(setting)
    return fixed + per_request, per_request / (fixed + per_request)
