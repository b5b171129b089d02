#!/usr/sbin/dtrace -qs
/*
 * tasks.d - how long the steps of asyncio tasks take, per coroutine.
 *
 * DTrace version of tasks.bt.  Times each step of an asyncio Task (C
 * implementation), from task-step-start to its task-step-done, with a
 * stack of start times per thread (the first step of an eager task runs
 * inside the step that creates it).  When the traced process exits (or on
 * Ctrl-C), prints a histogram of the step durations, in nanoseconds, per
 * coroutine __qualname__, then per coroutine the number of steps, their
 * total, average and longest duration, the largest total last.
 *
 * Usage:
 *
 *   dtrace -q -s tasks.d -c "python3.13 script.py"
 *   dtrace -q -s tasks.d -p PID
 */

self int depth;

python$target:::task-step-start
{
	self->start[self->depth] = timestamp;
	self->depth++;
}

python$target:::task-step-done
/self->depth > 0/
{
	self->depth--;
}

python$target:::task-step-done
/self->start[self->depth]/
{
	this->ns = timestamp - self->start[self->depth];
	self->start[self->depth] = 0;
	@total_ns[copyinstr(arg1)] = sum(this->ns);
	@steps[copyinstr(arg1)] = count();
	@avg_ns[copyinstr(arg1)] = avg(this->ns);
	@max_ns[copyinstr(arg1)] = max(this->ns);
	@step_ns[copyinstr(arg1)] = quantize(this->ns);
}

dtrace:::END
{
	printa(@step_ns);
	printf("%-40s %14s %8s %10s %12s\n", "COROUTINE", "TOTAL_NS", "STEPS",
	       "AVG_NS", "MAX_NS");
	printa("%-40s %@14d %@8d %@10d %@12d\n", @total_ns, @steps, @avg_ns,
	       @max_ns);
}
