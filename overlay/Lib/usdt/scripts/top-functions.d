#!/usr/sbin/dtrace -qs
/*
 * top-functions.d - the Python functions entered most often.
 *
 * Counts function-entry probes per file, function name and line of the
 * "def" in the traced process (-c or -p), and prints the 20 most frequent
 * when tracing stops (the end of the -c command or of the -p process, or
 * Ctrl-C), the most frequent last.  Each resumption of a generator or
 * coroutine counts as an entry, like a call.
 *
 * The Solaris version of this script watched every interpreter on the
 * system at once, with the provider name "python*", and refreshed the
 * screen every second.  DTrace for Linux's stapsdt provider, which reads
 * the probes of this interpreter, accepts no wildcard in the provider
 * name ("probe description python*:::function-entry does not match any
 * probes"): it must be python$target (the process of -c or -p) or
 * python<PID>.  So this version traces one process, and, like
 * top-functions.bt, prints its totals once, when tracing stops.
 *
 * Usage:
 *
 *   dtrace -q -s top-functions.d -c "python3.13 script.py"
 *   dtrace -q -s top-functions.d -p PID      # then Ctrl-C
 */

python$target:::function-entry
{
	@calls[copyinstr(arg0), arg2, copyinstr(arg1)] = count();
}

dtrace:::END
{
	printf("%-60s %6s %-30s %8s\n", "FILENAME", "LINE", "FUNCTION",
	       "CALLS");
	trunc(@calls, 20);
	printa("%-60s %6d %-30s %@8d\n", @calls);
}
