"""From a name or a path to a loaded model: where its files are (`sources`, `parts`), what will
be built before any weight is read (`load_plan`, `format_costs`), what it costs in memory
(`memory`) and the loading itself (`load`). The only part of `models` that imports every other."""
