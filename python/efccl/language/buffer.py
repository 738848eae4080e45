"""The symbolic contents of one buffer of one rank while a program is traced."""


class SymbolicBuffer(list):
    """A list of Chunk / ReduceChunk / None that grows when written past its end (scratch and
    named buffers) and can record which indices are read (to derive a custom collective's
    postconditions from the chunks its ``check`` inspects)."""

    def __init__(self, values=()):
        super().__init__(values)
        self._read = None

    def put(self, index, value):
        if index >= len(self):
            self.extend([None] * (index + 1 - len(self)))
        list.__setitem__(self, index, value)

    def instance_size(self):
        """MSCCLang's name for the number of chunks the buffer holds."""
        return len(self)

    def start_recording(self):
        self._read = set()

    def stop_recording(self):
        read, self._read = self._read or set(), None
        return read

    def _note(self, indices):
        if self._read is not None:
            self._read.update(i for i in indices if 0 <= i < len(self))

    def __getitem__(self, key):
        if self._read is not None:
            if isinstance(key, slice):
                self._note(range(*key.indices(len(self))))
            elif isinstance(key, int):
                self._note([key if key >= 0 else key + len(self)])
        return list.__getitem__(self, key)

    def __iter__(self):
        if self._read is not None:
            self._note(range(len(self)))
        return list.__iter__(self)
