// STUB (being written by the XML helper)
