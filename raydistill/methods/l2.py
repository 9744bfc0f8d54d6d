"""L2 baseline: the student regresses the frozen teacher's vector of the same sentence.

    L = mean_i ‖s(x_i) − t(x_i)‖²
"""

from raydistill.methods.base import MethodSpec
from raydistill.methods.ckd import single_view_features
from raydistill.objectives import L2DistillLoss

SPEC = MethodSpec(
    name="l2",
    summary="L2 baseline: regress the teacher vector (MSE)",
    views={"a": "none"},
    teacher_views=("a",),
    needs_teacher=True,
    default_loss={},
    loss_class=L2DistillLoss,
    batch_to_features=single_view_features,
    project_to_teacher=True,
)
