"""The ``modelpress`` command: argument parsing and printing only; the work is in the library."""
