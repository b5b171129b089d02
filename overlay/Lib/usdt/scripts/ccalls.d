#!/usr/sbin/dtrace -qs
/*
 * ccalls.d - the C functions that Python code calls, with their latency.
 *
 * DTrace version of ccalls.bt.  Times each call of a C function made from
 * Python code, from its cfunction-entry probe to the cfunction-return of
 * the same call (a return or an exception); calls nested inside it (a C
 * function that runs Python code that calls C functions again) are timed
 * on their own, with a stack of start times per thread.  When the traced
 * process exits (or on Ctrl-C), prints per callable, named by its module
 * and qualified name (builtins len, time sleep, builtins list.append), the
 * total time spent in it, its number of calls and their average duration,
 * in nanoseconds, the largest total last; then, if MODULE and FUNCNAME are
 * given, a histogram of the durations of that callable's calls.
 *
 * Usage:
 *
 *   dtrace -q -s ccalls.d -c "python3.13 script.py" [MODULE FUNCNAME]
 *   dtrace -q -s ccalls.d -p PID [MODULE FUNCNAME]
 */

#pragma D option defaultargs

self int depth;

python$target:::cfunction-entry
{
	self->start[self->depth] = timestamp;
	self->depth++;
}

/* Before the depth is popped below: the callable given as arguments. */
python$target:::cfunction-return
/self->depth > 0 && self->start[self->depth - 1] &&
 copyinstr(arg3) == $$1 && copyinstr(arg1) == $$2/
{
	@latency_ns[$$1, $$2] =
	    quantize(timestamp - self->start[self->depth - 1]);
}

python$target:::cfunction-return
/self->depth > 0/
{
	self->depth--;
}

python$target:::cfunction-return
/self->start[self->depth]/
{
	this->ns = timestamp - self->start[self->depth];
	self->start[self->depth] = 0;
	@total_ns[copyinstr(arg3), copyinstr(arg1)] = sum(this->ns);
	@calls[copyinstr(arg3), copyinstr(arg1)] = count();
	@avg_ns[copyinstr(arg3), copyinstr(arg1)] = avg(this->ns);
}

dtrace:::END
{
	printf("%-20s %-32s %14s %10s %10s\n",
	       "MODULE", "FUNCNAME", "TOTAL_NS", "CALLS", "AVG_NS");
	printa("%-20s %-32s %@14d %@10d %@10d\n", @total_ns, @calls, @avg_ns);
	printa(@latency_ns);
}
