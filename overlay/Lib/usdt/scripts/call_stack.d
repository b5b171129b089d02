#!/usr/sbin/dtrace -qs
/*
 * call_stack.d - show the call/return hierarchy of a Python program,
 * from the first call of a function named "start" to its return.
 *
 * One line per function-entry / function-return probe: a timestamp
 * (nanoseconds), the probe name, an indentation of one space per level of
 * nesting (per thread), then file:function:line.  An "entry" is a call or
 * the resumption of a generator or coroutine; a "return" is a return, a
 * yield/await suspension or an exception leaving the frame.  The line is
 * the "def" line on entry and the line being executed on return.
 *
 * Usage:
 *
 *   dtrace -q -s call_stack.d -c "python3.13 script.py"
 *
 * To follow another function, replace "start" in both predicates below.
 */

self int indent;

python$target:::function-entry
/copyinstr(arg1) == "start"/
{
	self->trace = 1;
}

python$target:::function-entry
/self->trace/
{
	printf("%d\t%*s:", timestamp, 15, probename);
	printf("%*s", self->indent, "");
	printf("%s:%s:%d\n", basename(copyinstr(arg0)), copyinstr(arg1), arg2);
	self->indent++;
}

python$target:::function-return
/self->trace/
{
	self->indent--;
	printf("%d\t%*s:", timestamp, 15, probename);
	printf("%*s", self->indent, "");
	printf("%s:%s:%d\n", basename(copyinstr(arg0)), copyinstr(arg1), arg2);
}

python$target:::function-return
/self->trace && self->indent == 0 && copyinstr(arg1) == "start"/
{
	self->trace = 0;
}
