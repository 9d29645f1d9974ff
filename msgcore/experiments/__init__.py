"""Each paper's own training stages, systems and tables (one module per chapter), on `msgcore.recipes` and the
shared foundation runs (`msgcore.foundations`). No module here imports another: what two chapters share lives below.
"""
from msgcore.foundations.baselines import (BASELINE_ANCHORS, BASELINE_DIRECTIONS, BASELINE_FLOORS,  # noqa: F401
                                           BASELINE_METRICS, BASELINE_SCALES, BASELINE_SEEDS, CLI_RECIPE_SCALES,
                                           TEST_SPLITS, baseline_data, baseline_floor_systems, baseline_seeds,
                                           baseline_system, cli_recipe, sanity_gate, train_baselines)
from msgcore.recipes import (RunResult, Scale, TranslationData, evaluate, get_scale, limit_eval_splits,  # noqa: F401
                             load_finished_run, load_multi30k_splits, mean_std, paired_delta, prepare_translation,
                             run_key, run_training, synthetic_splits, train_model, train_translation)
