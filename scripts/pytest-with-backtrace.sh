#!/usr/bin/env bash
# Runs the test suite (make test). If the pytest process itself dies of a signal (a crash in native code, not a
# failed test), the native backtrace of every thread is printed from its core dump: Python's faulthandler
# cannot report a crash on a thread's overflowed stack, or after a library replaced its handler.
set -u
ulimit -c unlimited 2>/dev/null || true
# The kernel writes "core" files to the process's working directory unless core_pattern says otherwise.
rm -f core core.[0-9]*
"$@"
rc=$?
if [ "$rc" -gt 128 ]; then
    echo "pytest died of signal $((rc - 128)) (see the backtrace below if a core was dumped)" >&2
    for core in core core.[0-9]*; do
        [ -f "$core" ] || continue
        if command -v gdb >/dev/null 2>&1; then
            gdb -q -batch -ex "info threads" -ex "thread apply all bt 30" "$1" "$core" 2>&1 | tail -400 >&2
        else
            echo "no gdb to read $core" >&2
        fi
    done
fi
rm -f core core.[0-9]*  # also those of servers and Ray workers the tests crashed on purpose (same directory)
exit "$rc"
