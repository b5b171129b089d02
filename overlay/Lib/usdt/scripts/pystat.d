#!/usr/sbin/dtrace -qs
/*
 * pystat.d - what a Python process does, second by second.
 *
 * DTrace version of pystat.bt: every second, one line with the Python
 * calls and resumptions (function-entry), C calls (cfunction-entry),
 * exceptions raised (exception-raise), garbage collections (gc-start),
 * time spent waiting for the GIL in microseconds (gil-take-start to
 * gil-take-done), threads started and stopped (thread-start, thread-stop)
 * of that second.  When DTrace ends (Ctrl-C, or the -c program exits), a
 * last line has what happened since the line before, so nothing is lost.
 *
 * DTrace for Linux 2.0.7 skips a tick-1s that finds its CPU idle (seen on
 * a quiet 2-CPU virtual machine: no line for a minute and more).  A line
 * then comes late, and has everything since the line before it: the
 * columns still add up, but a line can span more than a second.
 *
 * Usage (stop with Ctrl-C):
 *
 *   dtrace -q -s pystat.d -p PID
 *   dtrace -q -s pystat.d -c "python3.13 script.py"
 */

self uint64_t asked;

dtrace:::BEGIN
{
	/* every aggregation has a value from the start, so every column
	   prints */
	@py_calls = sum(0);
	@c_calls = sum(0);
	@exc_raised = sum(0);
	@gc = sum(0);
	@gil_wait = sum(0);
	@thr_start = sum(0);
	@thr_stop = sum(0);
	printf("%-20s %10s %10s %10s %6s %12s %9s %9s\n", "TIME", "PY_CALLS",
	       "C_CALLS", "EXC_RAISED", "GC", "GIL_WAIT_US", "THR_START",
	       "THR_STOP");
}

python$target:::function-entry { @py_calls = sum(1); }
python$target:::cfunction-entry { @c_calls = sum(1); }
python$target:::exception-raise { @exc_raised = sum(1); }
python$target:::gc-start { @gc = sum(1); }
python$target:::thread-start { @thr_start = sum(1); }
python$target:::thread-stop { @thr_stop = sum(1); }

python$target:::gil-take-start
{
	self->asked = timestamp;
}

python$target:::gil-take-done
/self->asked/
{
	@gil_wait = sum(timestamp - self->asked);
	self->asked = 0;
}

profile:::tick-1s,
dtrace:::END
{
	normalize(@gil_wait, 1000);
	printf("%-20Y", walltimestamp);
	printa(" %@10d", @py_calls);
	printa(" %@10d", @c_calls);
	printa(" %@10d", @exc_raised);
	printa(" %@6d", @gc);
	printa(" %@12d", @gil_wait);
	printa(" %@9d", @thr_start);
	printa(" %@9d", @thr_stop);
	printf("\n");
	clear(@py_calls);
	clear(@c_calls);
	clear(@exc_raised);
	clear(@gc);
	clear(@gil_wait);
	clear(@thr_start);
	clear(@thr_stop);
}
