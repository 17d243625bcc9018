"""Task kinds: each module owns its formats, encoding, head, loss, decoding and metrics."""

from bertheads.tasks.classify import ClassifyTask
from bertheads.tasks.qa import QATask
from bertheads.tasks.tag import TagTask

TASKS = {"classify": ClassifyTask, "tag": TagTask}
TASKS["qa"] = QATask
