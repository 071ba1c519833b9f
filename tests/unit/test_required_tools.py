"""A tool the tests need that is missing fails the test, naming how to install it; only `make test-fast`
(`TESTS_MAY_SKIP=1`) lets it skip, and `make test`'s first step lists every missing tool before any test runs."""

from __future__ import annotations

import pytest

from tests.support import required_tools
from tests.support.required_tools import Tool, require

ABSENT = Tool("the frobnicator", lambda: False, "apt-get install -y frobnicator")


def test_a_missing_tool_fails_the_test_naming_how_to_install_it(monkeypatch):
    monkeypatch.delenv(required_tools.MAY_SKIP, raising=False)
    with pytest.raises(pytest.fail.Exception, match="the frobnicator is missing: apt-get install -y frobnicator"):
        require(ABSENT)


def test_only_the_quick_target_lets_it_skip(monkeypatch):
    monkeypatch.setenv(required_tools.MAY_SKIP, "1")
    with pytest.raises(pytest.skip.Exception, match="apt-get install -y frobnicator"):
        require(ABSENT)
    require(Tool("present", lambda: True, "nothing"))  # a tool that is there neither fails nor skips


def test_make_tests_first_step_lists_every_missing_tool(monkeypatch, capsys):
    monkeypatch.setattr(required_tools, "TOOLS", (ABSENT, required_tools.POSTGRES))
    assert required_tools.main() == 1
    assert "make test: the frobnicator is missing: apt-get install -y frobnicator" in capsys.readouterr().err
