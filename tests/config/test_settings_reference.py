"""The configuration reference: every variable read is documented, and the
generated docs/configuration.md is current (config.settings_reference)."""

from __future__ import annotations

import textwrap

from config import settings_reference as ref


def test_every_variable_read_is_documented_and_the_reference_is_current():
    """A variable read in the settings or elsewhere without a meaning in
    config/settings_reference.toml, a meaning for a variable read nowhere, or a
    docs/configuration.md not regenerated since: each fails, saying what to do."""
    variables, unresolved = ref.collect()
    meanings = ref.load_meanings()
    problems = ref.check(variables, unresolved, meanings)
    assert not problems, problems.report()
    expected = ref.render(variables, meanings)
    assert ref.OUTPUT.read_text() == expected, (
        "docs/configuration.md is stale: python -m config.settings_reference --write"
    )


def test_the_scan_sees_the_settings_that_everyone_relies_on():
    """Guards the scanner itself: variables read in each helper's style are found."""
    variables, _ = ref.collect()
    for name in ("DJANGO_ENV", "DATABASE_URL", "ENGINE_KV_CACHE_MB", "DJANGO_ALLOWED_HOSTS"):
        assert name in variables, name
    assert "config/settings" in variables["ENGINE_KV_CACHE_MB"].paths[0]
    # Outside the settings: a module constant names the variable.
    assert variables["GPUWORKERS_CPU_KERNELS"].paths == ["gpuworkers/engine/cpu/build.py"]


SPLIT_BASE = """
    import os
    import environ

    env = environ.Env()
    SWITCH = "SOME_SWITCH"

    def env_int(name, default):
        value = os.environ.get(name)
        return default if value in (None, "") else int(value)

    DJANGO_ENV = env.str("DJANGO_ENV", default="production")
    PAGES = env_int("PAGES", 7)
    QUIET = env.bool("QUIET", False)
    CACHE = os.environ.get("CACHE_DIR") or "/tmp/cache"
    if "EXTRA_HOSTS" in os.environ:
        HOSTS = env.list("EXTRA_HOSTS")
    ON = os.getenv(SWITCH, "1") == "1"
"""
SPLIT_PRODUCTION = """
    import os
    from .base import *  # noqa

    SECRET = os.environ["SECRET"]
    os.environ.setdefault("NOT_A_READ", "x")
    NAME = "DYNAMIC"
    WHAT = os.environ.get(NAME + "_X")
"""


def test_the_split_settings_package_is_read_in_both_layouts(tmp_path):
    """config/settings/{base,production}.py (issue 31's layout) is scanned like
    config/settings.py: every form of read is found with its default, a write
    is not a read, and a read by a computed name is reported."""
    package = tmp_path / "config" / "settings"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "base.py").write_text(textwrap.dedent(SPLIT_BASE))
    (package / "production.py").write_text(textwrap.dedent(SPLIT_PRODUCTION))
    variables, unresolved = ref.collect(tmp_path)
    defaults = {name: [r.default for r in v.reads] for name, v in variables.items()}
    assert defaults == {
        "DJANGO_ENV": ["'production'"],
        "PAGES": ["7"],
        "QUIET": ["False"],
        "CACHE_DIR": ["'/tmp/cache'"],
        "EXTRA_HOSTS": [None, None],
        "SOME_SWITCH": ["'1'"],
        "SECRET": ["(required)"],
    }
    assert variables["SECRET"].paths == ["config/settings/production.py"]
    assert len(unresolved) == 1 and "production.py" in unresolved[0]


def test_an_undocumented_variable_and_a_stale_meaning_are_named():
    variables = {"NEW_SETTING": ref.Variable("NEW_SETTING")}
    meanings = ref.Meanings(
        entries={"OLD_SETTING": ("S", "gone", None), "FROM_A_SCRIPT": ("S", "bin/x", None)},
        external={"FROM_A_SCRIPT"},
        ignored=set(),
        sections=["S"],
        intro="",
    )
    problems = ref.check(variables, [], meanings)
    assert problems.undocumented == ["NEW_SETTING"]
    assert problems.unread == ["OLD_SETTING"]
    assert "NEW_SETTING" in problems.report() and "settings_reference.toml" in problems.report()
