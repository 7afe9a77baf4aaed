"""``python -m trainer.train`` in the test process: absl parses the arguments into the module's flags and
``main`` runs, as the command line does, without starting another Python (TensorFlow and JAX imported again,
seconds of CPU for each run).

The default run checks the command line's messages, exit statuses and start-up SIGTERM this way; CI's
integration run repeats them on the real command line in a subprocess (what only a process shows: nothing
else on its stderr, the signal while it imports).
"""

import os
import sys

from absl import flags

from tests.repo_root import ROOT

TINY = os.path.join(ROOT, "trainer", "configs", "tiny.py")


def run(argv, capfd, *, parse=None) -> tuple:
    """(exit status, stdout, stderr) of ``python -m trainer.train *argv``, run in this process.

    ``parse``: the flags parser (``trainer.train``'s ``parse_flags`` by default, as its ``app.run`` is given).
    A ``SystemExit`` with a message counts as Python reports it: the message on stderr, status 1. The
    flags (and ``sys.argv``, where ml_collections reads the ``--config.X`` overrides) are put back afterwards:
    a test may run the command line again.
    """
    from trainer import train

    capfd.readouterr()  # what came before is not the command's
    argv, before = ["trainer.train", *argv], sys.argv
    try:
        sys.argv = argv
        try:
            (parse or train.parse_flags)(argv)
            train.main([])
            status = 0
        except SystemExit as exit_:
            status = exit_.code
    finally:
        sys.argv = before
        flags.FLAGS.unparse_flags()
        for name in [name for name in flags.FLAGS if name.startswith("config.")]:
            delattr(flags.FLAGS, name)  # the overrides' flags, which parsing the config flag defines
    out, err = capfd.readouterr()
    if isinstance(status, str):
        status, err = 1, err + status + "\n"
    return status or 0, out, err
