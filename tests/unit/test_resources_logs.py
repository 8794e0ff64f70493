"""Log lines of the driver and of every worker: rollart's own at the run's level, other libraries' (an HTTP
client's line per request) only from WARNING, each with time, level and logger."""

import subprocess
import sys
import textwrap


def test_rollarts_lines_at_the_run_level_other_libraries_from_warning_each_with_its_level():
    code = textwrap.dedent("""\
        import logging
        from rollart.resources.logs import configure_logging
        configure_logging("INFO")
        logging.getLogger("rollart.envs").info("env started")
        logging.getLogger("rollart.envs").debug("not shown")
        logging.getLogger("httpx2").info("HTTP Request: POST /v1/chat/completions")
        logging.getLogger("calculator_agent").warning("an agent's warning")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    lines = out.stderr.splitlines()
    assert out.returncode == 0 and len(lines) == 2, out.stderr
    assert lines[0].endswith(" INFO rollart.envs: env started")
    assert lines[1].endswith(" WARNING calculator_agent: an agent's warning")


def test_a_log_line_shows_control_characters_as_escapes_and_keeps_newlines():
    """What a policy or a user's file wrote reaches a log line as data: a terminal escape or a bidi override is
    shown, never obeyed; a traceback's newlines stay."""
    import logging

    from rollart.resources.logs import LOG_FORMAT, EscapingFormatter

    record = logging.LogRecord("rollart.envs", logging.WARNING, __file__, 1, "answer %s",
                               ("\x1b[2J\u202eevil\nnext line\tcol",), None)
    line = EscapingFormatter(LOG_FORMAT).format(record)
    assert "\\x1b[2J" in line and "\\u202e" in line and "\x1b" not in line and "\u202e" not in line
    assert "evil\nnext line\tcol" in line
