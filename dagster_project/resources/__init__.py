from dagster_project.resources.environment import resources_from_env
from dagster_project.resources.eval_sets import EvalSets
from dagster_project.resources.fleet import SGLangFleet
from dagster_project.resources.generation import GenerationConfig
from dagster_project.resources.store import DatasetStore
from dagster_project.resources.tokenizer import TokenizerResource

__all__ = ["DatasetStore", "EvalSets", "GenerationConfig", "SGLangFleet", "TokenizerResource", "resources_from_env"]
