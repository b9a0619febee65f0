"""User-facing errors.

Every problem with the user's input (a missing file, a model that is not ONNX, an unsupported
opset, a failed golden check) is raised as :class:`CinmError` with a one-line message. The CLI
prints that line and exits with status 1; it never shows a traceback for these.
"""


class CinmError(Exception):
    """A problem with the user's input or request, described in one line."""


class CheckFailed(CinmError):
    """The optimized model does not compute what the original computes (golden check)."""


class ReferenceFailed(CinmError):
    """Onnxruntime cannot run the *original* model on the check's inputs (random inputs of the
    wrong size for it, say), so the golden check cannot judge the optimized one."""
