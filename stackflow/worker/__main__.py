"""``python -m stackflow.worker``: the worker (:mod:`stackflow.worker.main`)."""

from stackflow.worker.main import shell_main

shell_main()
