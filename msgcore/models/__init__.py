"""One small file per paper, each built on the shared core (attention, layers, model, generation).

MODELS maps the class names stored in checkpoints to classes, so `load_model` can rebuild them.
"""
from msgcore.model import Transformer
from msgcore.models.coverage_nat import CoverageNAT
from msgcore.models.marge import MargeTransformer
from msgcore.models.mixrep import MixRepTransformer
from msgcore.models.postech_ape import PostechAPE
from msgcore.models.trice import TriceTransformer

MODELS = {"Transformer": Transformer, "TriceTransformer": TriceTransformer, "CoverageNAT": CoverageNAT,
          "MargeTransformer": MargeTransformer}
MODELS["PostechAPE"] = PostechAPE
MODELS["MixRepTransformer"] = MixRepTransformer
