"""Task kinds: each module owns its formats, encoding, head, loss, decoding and metrics.
`TASKS` is the registry the command line, the bundle and `extract` read: one line per kind."""

from bertheads.tasks.classify.task import ClassifyTask
from bertheads.tasks.qa.task import QATask
from bertheads.tasks.tag.task import TagTask

TASKS = {cls.kind: cls for cls in (ClassifyTask, TagTask, QATask)}
