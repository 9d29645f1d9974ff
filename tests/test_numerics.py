"""msgcore.numerics: the families' versions, and what changed since a results file recorded them."""
import pytest

from msgcore import numerics, runcache
from msgcore.utils import MsgcoreError


def test_core_is_the_results_version_and_always_included():
    assert numerics.FAMILIES["core"] == runcache.RESULTS_VERSION
    assert numerics.versions() == {"core": runcache.RESULTS_VERSION}
    assert list(numerics.versions("marge", "trice")) == ["core", "marge", "trice"]
    assert numerics.versions("marge", "trice")["marge"] == numerics.FAMILIES["marge"]


def test_an_unknown_family_is_one_line_naming_the_known_ones():
    with pytest.raises(MsgcoreError, match="unknown numerics family 'tirce'; known: core, trice") as error:
        numerics.versions("trice", "tirce")
    assert "\n" not in str(error.value)


def test_changed_names_each_family_that_moved():
    current = numerics.versions("trice", "mixrep")
    assert numerics.changed(current, ["trice", "mixrep"]) == []
    assert numerics.changed({**current, "marge": 0}, ["trice"]) == []  # a family not asked about does not count
    assert numerics.changed(None, ["trice"]) == numerics.changed({}, ["trice"]) == ["numerics not recorded"]
    old = {"core": current["core"] - 1, "trice": current["trice"] + 1}  # mixrep missing
    assert numerics.changed(old, ["trice", "mixrep"]) == [
        f"core numerics {current['core'] - 1} → {current['core']}",
        f"trice numerics {current['trice'] + 1} → {current['trice']}",
        f"mixrep numerics not recorded (now {current['mixrep']})"]
    with pytest.raises(MsgcoreError, match="unknown numerics family"):
        numerics.changed(current, ["nope"])
