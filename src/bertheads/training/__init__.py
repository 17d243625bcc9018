"""Training, the library layer: `settings` and `flags` (what a run is told), `joint` (tasks prepared and
trained together, the config file), `loop` (the explicit epoch loop and the kept-epoch rule),
`checkpoint` (resumable state), `runlog` (the run's log), `tune` (the settings search)."""
