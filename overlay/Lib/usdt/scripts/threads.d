#!/usr/sbin/dtrace -qs
/*
 * threads.d - when each Python thread started and stopped, and how long
 * it ran.
 *
 * DTrace version of threads.bt.  One line per thread-start and
 * thread-stop probe: a timestamp (nanoseconds), the event,
 * threading.get_ident() and threading.get_native_id() of the thread, and,
 * on a stop, how long it ran in microseconds ("-" if it started before
 * tracing did).  When the traced process exits (or on Ctrl-C), @running
 * lists every thread seen starting: 1 if it is still running, 0 if it
 * stopped.
 *
 * Usage:
 *
 *   dtrace -q -s threads.d -c "python3.13 script.py"
 *   dtrace -q -s threads.d -p PID
 */

self uint64_t started;

dtrace:::BEGIN
{
	printf("%-19s %-5s %20s %10s %12s\n",
	       "TIME_NS", "EVENT", "THREAD_ID", "NATIVE_ID", "DURATION_US");
}

/* thread-start and thread-stop fire in the thread itself */
python$target:::thread-start
{
	self->started = timestamp;
	@running[arg0, arg1] = sum(1);
	printf("%-19d %-5s %20u %10u\n", timestamp, "start", arg0, arg1);
}

/*
 * A thread that started before tracing did: this clause comes first, as
 * the next one clears self->started, and DTrace runs a probe's clauses
 * in order.
 */
python$target:::thread-stop
/!self->started/
{
	printf("%-19d %-5s %20u %10u %12s\n", timestamp, "stop", arg0, arg1,
	       "-");
}

python$target:::thread-stop
/self->started/
{
	printf("%-19d %-5s %20u %10u %12d\n", timestamp, "stop", arg0, arg1,
	       (timestamp - self->started) / 1000);
	self->started = 0;
	@running[arg0, arg1] = sum(-1);
}

dtrace:::END
{
	printf("%-19d end\n", timestamp);
	printa("@running[%u, %u]: %@d\n", @running);
}
