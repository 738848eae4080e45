// STUB (being written by the executor helper)
