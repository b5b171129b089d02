#!/usr/sbin/dtrace -qs
/*
 * top-functions.d - the Python functions entered most often, every second.
 *
 * Counts function-entry probes per process, file, function name and line
 * of the "def", over all the processes running an interpreter with the
 * python provider, and every second clears the screen and prints the 20
 * most frequent, the most frequent last.  Each resumption of a generator
 * or coroutine counts as an entry, like a call.
 *
 * Usage (stop with Ctrl-C):
 *
 *   dtrace -q -s top-functions.d
 */

python*:::function-entry
{
	@calls[pid, copyinstr(arg0), copyinstr(arg1), arg2] = count();
}

tick-1s
{
	printf("\033[2J\033[1;1H");
	printf("%6s %60s %6s %30s %8s\n",
	       "PID", "FILENAME", "LINE", "FUNCTION", "CALLS");
	trunc(@calls, 20);
	printa("%6d %60s %6d %30s %@8d\n", @calls);
	trunc(@calls);
}
