"""The run layer: one :class:`Run` for every layout (see :mod:`ckptkit.run.core`)."""

from ckptkit.run.core import Resume, Run, Settled
from ckptkit.run.layout import Checked, Layout
from ckptkit.run.native import NativeLayout
from ckptkit.run.resume import resume_target

__all__ = ["Checked", "Layout", "NativeLayout", "Resume", "Run", "Settled", "resume_target"]
