"""The base floor: the one id range check (row indices and text codes) and the version
the run records (read from the installed metadata, not from the package face above)."""

import numpy as np
import pytest

import hogkit
from hogkit.errors import InvalidArgument
from hogkit.report import environment
from hogkit.validation import check_ids_below, check_indices
from hogkit.workloads.text import decode, unigram_entropy


def test_environment_records_the_package_version():
    assert environment()["hogkit"] == hogkit.__version__


@pytest.mark.parametrize("bad", [-1, 5])
def test_check_ids_below_names_the_value_and_the_whole(bad):
    ids = np.array([0, bad, 2], np.int64)
    with pytest.raises(InvalidArgument, match=rf"^ids holds id {bad}, outside \[0, 5\) "
                                              rf"for a set of 5$"):
        check_ids_below("ids", ids, 5, what="id", of="a set of 5")
    check_ids_below("ids", np.array([0, 4, 2], np.uint8), 5, what="id", of="a set of 5")


def test_row_indices_and_codes_share_the_check():
    with pytest.raises(InvalidArgument, match=r"idx holds row index 3, outside \[0, 3\) "
                                              r"for a table of 3 rows"):
        check_indices("idx", np.array([0, 3], np.int64), 3)
    assert check_indices("idx", np.zeros(0, np.int64), 3).size == 0
    with pytest.raises(InvalidArgument, match=r"codes holds id -2, outside \[0, 4\) for a "
                                              r"vocabulary of 4"):
        unigram_entropy(np.array([1, -2], np.int64), 4)
    assert decode(np.zeros(0, np.int64), "ab") == ""
