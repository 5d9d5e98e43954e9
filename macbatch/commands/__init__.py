"""The commands that belong to no one front end (ask, bench, cache, doctor, models, pull, rm),
the options several commands share (`options.py`), and the launcher's join that runs before any
command (`launch.py`). `macbatch/cli.py` only registers them."""
