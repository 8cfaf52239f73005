"""The marks codegen's rewrites leave on the stages they make (keys of ``op.attrs``),
read by the analyses that plan those stages.

One job: the vocabulary shared by :mod:`codegen.rewrite` (which writes the
marks) and :mod:`codegen.analysis` (which reads them), so that neither imports
the other for a string.
"""

__all__ = ["PACKED", "TAP_SPLIT", "WINDOW", "WINDOW_ORDER", "WINDOWED"]

#: a stage whose data-dependent conjuncts its packed operands already apply
#: (:func:`codegen.rewrite.operands.pack_operands`; read by the contraction matcher)
PACKED = "texpr.packed_operands"
#: a stage made by the tap split (never split again; a tap-sum stage has a shift plan)
TAP_SPLIT = "texpr.tap_split"
#: a window stage: its valid region, a list of ``(tap_dim, pos_dim, a, b, c, n)``:
#: its elements are zeros where ``0 <= a * pos + b * tap + c < n`` fails for one of them
WINDOW = "texpr.window"
#: a window stage's axis order (the source's axes, then the taps)
WINDOW_ORDER = "texpr.window_order"
#: a stage reading a window stage
WINDOWED = "texpr.windowed"
