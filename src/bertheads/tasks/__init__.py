"""Task kinds: each module owns its formats, encoding, head, loss, decoding and metrics."""

from bertheads.tasks.classify import ClassifyTask

TASKS = {"classify": ClassifyTask}

try:  # kinds added as they are built
    from bertheads.tasks.tag import TagTask

    TASKS["tag"] = TagTask
except ImportError:  # pragma: no cover
    pass
try:
    from bertheads.tasks.qa import QATask

    TASKS["qa"] = QATask
except ImportError:  # pragma: no cover
    pass
