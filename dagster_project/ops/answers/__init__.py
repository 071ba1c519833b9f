"""The operator's questions, one module each: the answer's dataclass, `answer_*` (from the `Readings`) and
`render_*` (its lines of `dflash status`).

progress, mtp, concurrency, storage, coverage, multi_turn and cost answer from `readings.Readings`; `ops.status`
takes the readings and collects the answers into one `Status`, and `ops.alerts` reads the answers to raise alerts.
"""
