"""Planning: the spec file, the grid of variants and seeds, the resolved config and its
keys, the task reference, the ``campaign init`` skeleton. Starts nothing: the task's own
answers come from a guarded child of the task host."""
