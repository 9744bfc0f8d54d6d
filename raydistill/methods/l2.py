"""L2 baseline: the student regresses the frozen teacher's vector of the same sentence.

    L = mean_i ‖s(x_i) − t(x_i)‖²
"""

from pydantic import Field, StrictBool

from raydistill.config.schema import section
from raydistill.methods.base import LossSettings, MethodSpec
from raydistill.methods.ckd import single_view_features
from raydistill.objectives import L2DistillLoss


@section
class L2LossSettings(LossSettings):
    """``loss:`` of the L2 baseline (raydistill.objectives.L2DistillLoss)."""

    normalize: StrictBool | None = Field(None, description="L2-normalise both vectors first (null: true)")

SPEC = MethodSpec(
    name="l2",
    summary="L2 baseline: regress the teacher vector (MSE)",
    views={"a": "none"},
    teacher_views=("a",),
    needs_teacher=True,
    loss_settings=L2LossSettings,
    loss_class=L2DistillLoss,
    batch_to_features=single_view_features,
    project_to_teacher=True,
)
