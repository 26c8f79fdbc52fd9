"""``python -m coded_shuffle_train.node``: torchrun's node for the training job or a script, its
ranks forked from one server (the emulated cluster's fixed nodes run it:
``tests/test_cluster.py``), and the short folder its server's socket takes where the temporary
folder is too deep for one."""

from __future__ import annotations

import os

import pytest

from coded_shuffle.tools.tempdirs import SERVER_SOCKET_TAIL, SOCKET_PATH_MAX, socket_base
from coded_shuffle_train import node


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nnodes", "1", "-m", "other"], "runs -m coded_shuffle_train or a script, not -m other"),
        (["--no-python", "train.sh"], "--no-python: a node forks Python ranks"),
        (["--standalone", "-m", "coded_shuffle_train"], "--standalone: on one machine"),
    ],
)
def test_a_node_refuses_what_it_does_not_run_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        node.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("python -m coded_shuffle_train.node: error: ")
    assert message in err[0]


def test_a_socket_takes_a_short_folder_where_the_temporary_one_is_too_deep(tmp_path):
    """The temporary folder where the server's socket path fits; else ``/tmp`` (Python 3.13's
    choice), whose path fits."""
    fits = "/" + "x" * (SOCKET_PATH_MAX - SERVER_SOCKET_TAIL - 1)
    assert socket_base(SERVER_SOCKET_TAIL, fits) == fits
    deep = fits + "x"
    short = socket_base(SERVER_SOCKET_TAIL, deep)
    assert short == "/tmp" and os.access(short, os.W_OK)
    assert len(short) + SERVER_SOCKET_TAIL <= SOCKET_PATH_MAX
