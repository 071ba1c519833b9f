import dagster as dg

from dagster_project.generation_settings import GenerationSettings
from dagster_project.resources.config_fields import config_fields


class GenerationConfig(config_fields(GenerationSettings, dg.ConfigurableResource)):
    """How every answer is generated. Defaults: the Qwen3.6 model card's thinking-mode settings.

    The values are fingerprinted into each completions manifest: changing any of them makes the shards
    generated under the old values stale instead of silently mixing settings.
    """
