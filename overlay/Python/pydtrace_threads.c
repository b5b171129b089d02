/* gil__take__start / gil__take__done / gil__drop and thread__start /
 * thread__stop probes (cpython-usdt).
 *
 * See Include/internal/pycore_dtrace.h for the rules every helper follows.
 * The hooks (one semaphore test each) are in Python/ceval_gil.c and
 * Modules/_threadmodule.c; the probe sites are here.
 *
 *   gil__take__start()  take_gil(): the thread starts taking the GIL
 *                       (before it waits for it, if it has to)
 *   gil__take__done()   take_gil(): the thread holds the GIL
 *   gil__drop()         drop_gil(): the thread releases the GIL
 *
 * No clock is read: a tracer times the gaps itself.  In the free-threaded
 * build the hooks compile to nothing, so the GIL probes never fire (even
 * with the GIL enabled at run time); their sites still exist here.
 *
 *   thread__start(thread_id, native_id)
 *       in a thread started by _thread.start_new_thread() (so by
 *       threading.Thread.start()), before it runs any Python code
 *   thread__stop(thread_id, native_id)
 *       in that thread after its thread state is deleted, so after its last
 *       Python code (including destructors run by clearing the thread
 *       state), and before Thread.join() returns in another thread
 *
 * thread_id is threading.get_ident() and native_id
 * threading.get_native_id() of the thread.  The main thread, and threads
 * created in C that call PyGILState_Ensure(), fire neither.
 */

#include "Python.h"
#include "pycore_dtrace.h"
#include "pythread.h"             // PyThread_get_thread_ident()

#ifdef WITH_DTRACE

void
_PyDTrace_FireGilTakeStart(void)
{
    PyDTrace_GIL_TAKE_START();
}

void
_PyDTrace_FireGilTakeDone(void)
{
    PyDTrace_GIL_TAKE_DONE();
}

void
_PyDTrace_FireGilDrop(void)
{
    PyDTrace_GIL_DROP();
}

static unsigned long
native_id(void)
{
#ifdef PY_HAVE_THREAD_NATIVE_ID
    return PyThread_get_thread_native_id();
#else
    return 0;
#endif
}

void
_PyDTrace_FireThreadStart(void)
{
    PyDTrace_THREAD_START(PyThread_get_thread_ident(), native_id());
}

void
_PyDTrace_FireThreadStop(void)
{
    PyDTrace_THREAD_STOP(PyThread_get_thread_ident(), native_id());
}

#endif  /* WITH_DTRACE */
