"""The registry: registration, lookup errors and building with options."""

from __future__ import annotations

import pytest

from candor.util.errors import CandorError
from candor.util.registry import Registry


def test_register_get_build_and_errors():
    reg: Registry[type] = Registry("widget")

    @reg.register("pair")
    class Pair:
        def __init__(self, a: int = 1, b: int = 2) -> None:
            self.total = a + b

    assert reg.get("pair") is Pair and "pair" in reg and reg.names() == ["pair"]
    assert reg.build("pair", a=5).total == 7
    with pytest.raises(CandorError, match=r"unknown widget 'nope'; known: pair"):
        reg.get("nope")
    with pytest.raises(CandorError, match=r"widget 'pair': bad options \['c'\]"):
        reg.build("pair", c=3)
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("pair")(Pair)


def _install_plugin_package(root, group: str, entries: dict[str, str], modules: dict[str, str]) -> None:
    """A real installed distribution on ``root``: modules plus a dist-info declaring ``group``'s entry points."""
    for name, source in modules.items():
        (root / f"{name}.py").write_text(source)
    info = root / "widget_plugins-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: widget-plugins\nVersion: 0.1\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entries.items())
    (info / "entry_points.txt").write_text(f"[{group}]\n{lines}")


def test_plugins_register_on_first_lookup_and_a_broken_one_is_logged_not_fatal(tmp_path, monkeypatch, caplog):
    group = "candor.test-widgets"
    _install_plugin_package(
        tmp_path,
        group,
        {"good": "widget_good", "broken": "widget_broken"},
        {
            "widget_good": "import tests_widget_registry as r\n\n@r.WIDGETS.register('gear')\nclass Gear: ...\n",
            "widget_broken": "raise ImportError('needs a package that is not installed')\n",
            "tests_widget_registry": f"from candor.util.registry import Registry\nWIDGETS = Registry('widget', "
            f"plugins={group!r})\n",
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import tests_widget_registry

    widgets = tests_widget_registry.WIDGETS
    with caplog.at_level("WARNING", logger="candor.util.registry"):
        assert "gear" in widgets  # the lookup imports the group's modules
        assert widgets.names() == ["gear"]
    assert widgets.get("gear").__name__ == "Gear"
    assert "widget plugin 'broken' (widget_broken) failed to load: needs a package" in caplog.text
    with pytest.raises(CandorError, match=r"unknown widget 'nope'; known: gear"):
        widgets.get("nope")


def test_candor_trained_estimators_join_the_registry_through_its_entry_points():
    from candor.estimators import ESTIMATORS

    assert ESTIMATORS.plugins == "candor.estimators"
    assert ESTIMATORS.get("elical").__module__ == "candor.train.elical.estimator"
    assert ESTIMATORS.get("probe").__module__ == "candor.train.probe"


def test_a_plugin_group_with_no_installed_entry_points_says_so_in_the_unknown_name_error():
    reg: Registry[type] = Registry("widget", plugins="candor.test-group-nobody-installs")
    expected = (
        r"unknown widget 'gear'; known: \(none\) \(no 'candor.test-group-nobody-installs' entry points "
        r"are installed: `pip install -e .` registers them\)"
    )
    with pytest.raises(CandorError, match=expected):
        reg.get("gear")
