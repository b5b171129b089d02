#!/usr/sbin/dtrace -qs
/*
 * gil.d - how long each thread waits for the GIL, how long it holds it.
 *
 * DTrace version of gil.bt.  Per thread: the waits, from gil-take-start to
 * gil-take-done, and the holds, from gil-take-done to the next gil-drop.
 * When the traced process exits (or on Ctrl-C), prints the histograms of
 * each thread's waits, then of its holds, in nanoseconds, each set under
 * its heading, then per thread its total
 * wait and hold and its contention, 100 * wait / (wait + hold) percent,
 * rounded down, then the same over all threads.  A free-threaded build
 * (--disable-gil) never fires these probes.
 *
 * Usage:
 *
 *   dtrace -q -s gil.d -c "python3.13 script.py"
 *   dtrace -q -s gil.d -p PID
 */

self uint64_t asked;
self uint64_t held;
self uint64_t wait;
self uint64_t hold;
self uint64_t pct;
uint64_t all_wait;
uint64_t all_hold;

python$target:::gil-take-start
{
	self->asked = timestamp;
}

python$target:::gil-take-done
/self->asked/
{
	this->ns = timestamp - self->asked;
	self->asked = 0;
	@wait_ns[tid] = quantize(this->ns);
	@wait_total_ns[tid] = sum(this->ns);
	self->wait += this->ns;
	/* under the GIL: no other thread updates it meanwhile */
	all_wait += this->ns;
}

python$target:::gil-take-done
{
	self->held = timestamp;
}

python$target:::gil-drop
/self->held/
{
	this->ns = timestamp - self->held;
	self->held = 0;
	@hold_ns[tid] = quantize(this->ns);
	@hold_total_ns[tid] = sum(this->ns);
	self->hold += this->ns;
	all_hold += this->ns;
}

/*
 * The thread's contention percentage, kept as a sum of its changes, so
 * that the aggregation holds its latest value.
 */
python$target:::gil-take-done,
python$target:::gil-drop
/self->wait + self->hold/
{
	this->pct = 100 * self->wait / (self->wait + self->hold);
	@contention_pct[tid] = sum((int64_t)this->pct - (int64_t)self->pct);
	self->pct = this->pct;
}

dtrace:::END
{
	printf("GIL waits per thread (ns):\n");
	printa(@wait_ns);
	printf("GIL holds per thread (ns):\n");
	printa(@hold_ns);
	printf("%10s %14s %14s %11s\n", "TID", "WAIT_NS", "HOLD_NS",
	       "CONTENTION");
	printa("%10d %@14d %@14d %@10d%%\n", @wait_total_ns, @hold_total_ns,
	       @contention_pct);
	this->all = all_wait + all_hold;
	printf("%10s %14d %14d %8d.%d%%\n", "all", all_wait, all_hold,
	       this->all ? 100 * all_wait / this->all : 0,
	       this->all ? 1000 * all_wait / this->all % 10 : 0);
}
