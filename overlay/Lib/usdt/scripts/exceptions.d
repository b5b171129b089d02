#!/usr/sbin/dtrace -qs
/*
 * exceptions.d - exceptions by type and site: raised, re-raised, handled.
 *
 * DTrace version of exceptions.bt.  Counts the exception-raise,
 * exception-reraise and exception-handled probes (sys.monitoring's RAISE,
 * RERAISE and EXCEPTION_HANDLED events) per exception type and site
 * (file, function and line).  When the traced process exits (or on
 * Ctrl-C), prints one line per event, type and site, the most frequent
 * last.
 *
 * Usage:
 *
 *   dtrace -q -s exceptions.d -c "python3.13 script.py"
 *   dtrace -q -s exceptions.d -p PID
 */

python$target:::exception-raise,
python$target:::exception-reraise,
python$target:::exception-handled
{
	@events[probename, copyinstr(arg3), copyinstr(arg0), copyinstr(arg1),
	        arg2] = count();
}

dtrace:::END
{
	printf("%-18s %-30s %8s  %s\n", "EVENT", "TYPE", "COUNT",
	       "FILE:FUNCTION:LINE");
	printa("%-18s %-30s %@8d  %s:%s:%d\n", @events);
}
