"""Task kinds: each module owns its formats, encoding, head, loss, decoding and metrics.
`TASKS` is the registry the command line, the bundle and `extract` read: one line per kind."""

from bertheads.tasks.classify import ClassifyTask
from bertheads.tasks.qa import QATask
from bertheads.tasks.tag import TagTask

TASKS = {cls.kind: cls for cls in (ClassifyTask, TagTask, QATask)}
