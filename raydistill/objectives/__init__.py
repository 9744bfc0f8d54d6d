"""Distillation objectives, the instance queue and their shared math: pure torch, no Ray.

Every loss is an ``nn.Module``, ``loss_module(features: dict[str, Tensor], labels=None) -> LossOutput``, over
embeddings or logits under the keys it documents (teacher and reference inputs detached inside); queue losses
update their queue inside ``forward``, after the logits, before backward.

| module | losses | paper |
|---|---|---|
| congen.py | ConGenLoss | Limkonchotiwat et al., Findings of EMNLP 2022 |
| sct.py | SCTLoss, SCTDistillLoss | Limkonchotiwat et al., TACL 2023, arXiv:2311.03228 |
| ckd.py | CKDLoss | DistilCSE stage 1, arXiv:2112.05638 |
| congen_ckd.py | ConGenCKDLoss | w · CKD + (1 − w) · ConGen on one queue (a recipe lever, no paper of its own) |
| distilcse_nli.py | SupervisedSimCSELoss, build_nli_triplets | DistilCSE stage 2 / SimCSE, arXiv:2104.08821 |
| dvbert.py | DvBERTLoss, SoftmaxClassifierLoss, TeacherAnnealing | Cheng, SIGIR 2021, arXiv:2104.08675 |
| classification.py | LogitCrossEntropyLoss | (DvBERT's NLI teachers) |
| trans_encoder.py, pairs.py | SoftBCELoss, cosine_to_target; CosineMSELoss | Liu et al., ICLR 2022, arXiv:2109.13059 |
| l2.py, simcse.py | L2DistillLoss, SimCSELoss | baselines |
"""

from raydistill.objectives.base import LossOutput
from raydistill.objectives.ckd import CKDLoss, LearnableScale
from raydistill.objectives.classification import LogitCrossEntropyLoss
from raydistill.objectives.congen import ConGenLoss
from raydistill.objectives.congen_ckd import ConGenCKDLoss
from raydistill.objectives.distilcse_nli import SupervisedSimCSELoss, build_nli_triplets, load_nli_triplets
from raydistill.objectives.dvbert import DvBERTLoss, SoftmaxClassifierLoss, TeacherAnnealing, annealed_target
from raydistill.objectives.l2 import L2DistillLoss
from raydistill.objectives.pairs import CosineMSELoss
from raydistill.objectives.queue import InstanceQueue
from raydistill.objectives.sct import SCTDistillLoss, SCTLoss
from raydistill.objectives.simcse import SimCSELoss
from raydistill.objectives.trans_encoder import SoftBCELoss, average_pseudo_labels, cosine_to_target

__all__ = ["CKDLoss", "ConGenCKDLoss", "ConGenLoss", "CosineMSELoss", "DvBERTLoss", "InstanceQueue", "L2DistillLoss",
           "LearnableScale", "LogitCrossEntropyLoss", "LossOutput", "SCTDistillLoss", "SCTLoss", "SimCSELoss",
           "SoftBCELoss", "SoftmaxClassifierLoss", "SupervisedSimCSELoss", "TeacherAnnealing", "annealed_target",
           "average_pseudo_labels", "build_nli_triplets", "cosine_to_target", "load_nli_triplets"]
