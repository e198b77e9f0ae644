"""The ``dlrover-kfp`` command line: thin commands over the library."""
