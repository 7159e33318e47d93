/* A stand-in for libcuda.so.1 on machines without a GPU: it exports the entry points that
 * probes/cuda.py traces, under the same names, each a function of its own that starts the way
 * libcuda's do (push %rbp, no endbr64; build.py checks), so uprobes attach and fire exactly as
 * on the real library.
 *
 * Behind them sits a simulated GPU queue in CLOCK_MONOTONIC time: every launch, graph launch,
 * copy or memset enqueues work, and synchronisation blocks until the queue has drained, the
 * way a real stream does: the waiting thread sleeps in poll() on a timerfd armed for the
 * moment the queue drains, so that, as with the driver's blocking sync (a poll on its device
 * file, woken by the GPU's completion interrupt), the kernel wakes it from interrupt context at
 * the simulated completion: its sched wake-up marks the GPU going idle. With
 * GPUJITTER_STUB_SYNC=spin in its environment, synchronisation spins on the CPU reading the
 * clock instead (CUDA's default schedule, and PyTorch's): no wake-up marks the drain, and a
 * thread preempted while spinning sees it only when it runs again.
 * Work sizes (an interface of the stub only): a kernel runs gridDimX
 * microseconds, a graph (uintptr_t)hGraphExec microseconds, a copy or memset bytes / 1000
 * microseconds (1 GB/s).
 */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef void *CUfunction, *CUstream, *CUevent, *CUcontext, *CUgraphExec, *CUhostFn;
typedef unsigned long long CUdeviceptr;
typedef struct {
    unsigned int gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
} CUlaunchConfig;

static pthread_mutex_t queue_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t busy_until_ns;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static __attribute__((noinline)) void enqueue(uint64_t work_us)
{
    pthread_mutex_lock(&queue_lock);
    uint64_t now = now_ns();
    uint64_t start = busy_until_ns > now ? busy_until_ns : now;
    busy_until_ns = start + work_us * 1000ull;
    pthread_mutex_unlock(&queue_lock);
}

static int sync_spins(void)
{
    static int spins = -1; /* read once; every thread reads the same answer */
    if (spins < 0) {
        const char *how = getenv("GPUJITTER_STUB_SYNC");
        spins = how != NULL && strcmp(how, "spin") == 0;
    }
    return spins;
}

static __attribute__((noinline)) void drain(void)
{
    if (sync_spins()) {
        uint64_t until;
        do { /* re-read: launches by other threads may extend the queue */
            pthread_mutex_lock(&queue_lock);
            until = busy_until_ns;
            pthread_mutex_unlock(&queue_lock);
        } while (now_ns() < until);
        return;
    }
    int fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
    for (;;) {
        pthread_mutex_lock(&queue_lock);
        uint64_t until = busy_until_ns;
        pthread_mutex_unlock(&queue_lock);
        if (now_ns() >= until) /* launches by other threads may have extended the queue */
            break;
        struct itimerspec at = {.it_value = {.tv_sec = until / 1000000000ull,
                                             .tv_nsec = until % 1000000000ull}};
        if (fd < 0 || timerfd_settime(fd, TFD_TIMER_ABSTIME, &at, NULL) < 0) {
            struct timespec ts = at.it_value; /* no timerfd: sleep until the drain instead */
            clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
            continue;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        poll(&p, 1, -1);
    }
    if (fd >= 0)
        close(fd);
}

/* When the simulated queue drains (CLOCK_MONOTONIC ns; in the past when it is empty): the
 * drills' truth for a GPU going idle inside a synchronisation. */
unsigned long long stubDrainsAtNs(void)
{
    pthread_mutex_lock(&queue_lock);
    uint64_t until = busy_until_ns;
    pthread_mutex_unlock(&queue_lock);
    return until;
}

CUresult cuInit(unsigned int flags) { (void)flags; return 0; }
CUresult cuDriverGetVersion(int *version) { *version = 13000; return 0; }

#define LAUNCH(name) \
    CUresult name(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, \
                  unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem, \
                  CUstream s, void **params, void **extra) \
    { (void)f; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shmem; (void)s; \
      (void)params; (void)extra; enqueue(gx); return 0; }
LAUNCH(cuLaunchKernel)
LAUNCH(cuLaunchKernel_ptsz)

#define LAUNCH_EX(name) \
    CUresult name(const CUlaunchConfig *config, CUfunction f, void **params, void **extra) \
    { (void)f; (void)params; (void)extra; enqueue(config->gridDimX); return 0; }
LAUNCH_EX(cuLaunchKernelEx)
LAUNCH_EX(cuLaunchKernelEx_ptsz)

#define LAUNCH_COOP(name) \
    CUresult name(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, \
                  unsigned int bx, unsigned int by, unsigned int bz, unsigned int shmem, \
                  CUstream s, void **params) \
    { (void)f; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shmem; (void)s; \
      (void)params; enqueue(gx); return 0; }
LAUNCH_COOP(cuLaunchCooperativeKernel)
LAUNCH_COOP(cuLaunchCooperativeKernel_ptsz)

CUresult cuLaunchCooperativeKernelMultiDevice(void *params, unsigned int n, unsigned int flags)
{ (void)params; (void)flags; enqueue(n); return 0; }

#define HOST_FN(name) \
    CUresult name(CUstream s, CUhostFn fn, void *data) \
    { (void)s; (void)fn; enqueue((uintptr_t)data); return 0; }
HOST_FN(cuLaunchHostFunc)
HOST_FN(cuLaunchHostFunc_ptsz)

#define GRAPH(name) \
    CUresult name(CUgraphExec g, CUstream s) { (void)s; enqueue((uintptr_t)g); return 0; }
GRAPH(cuGraphLaunch)
GRAPH(cuGraphLaunch_ptsz)

#define COPY_ASYNC(name) \
    CUresult name(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s) \
    { (void)dst; (void)src; (void)s; enqueue(bytes / 1000); return 0; }
COPY_ASYNC(cuMemcpyAsync)
COPY_ASYNC(cuMemcpyAsync_ptsz)
COPY_ASYNC(cuMemcpyHtoDAsync_v2)
COPY_ASYNC(cuMemcpyHtoDAsync_v2_ptsz)
COPY_ASYNC(cuMemcpyDtoHAsync_v2)
COPY_ASYNC(cuMemcpyDtoHAsync_v2_ptsz)
COPY_ASYNC(cuMemcpyDtoDAsync_v2)
COPY_ASYNC(cuMemcpyDtoDAsync_v2_ptsz)
COPY_ASYNC(cuMemsetD8Async)
COPY_ASYNC(cuMemsetD8Async_ptsz)
COPY_ASYNC(cuMemsetD32Async)
COPY_ASYNC(cuMemsetD32Async_ptsz)

/* 2D/3D, peer and batched copies take descriptors; the stub reads a byte count from the
 * first argument's place (what the feeding loop passes). */
#define COPY_DESC(name) \
    CUresult name(const void *desc, CUstream s) \
    { (void)s; enqueue((uintptr_t)desc / 1000); return 0; }
COPY_DESC(cuMemcpy2DAsync_v2)
COPY_DESC(cuMemcpy2DAsync_v2_ptsz)
COPY_DESC(cuMemcpy3DAsync_v2)
COPY_DESC(cuMemcpy3DAsync_v2_ptsz)

#define COPY_PEER(name) \
    CUresult name(CUdeviceptr dst, CUcontext dc, CUdeviceptr src, CUcontext sc, size_t bytes, \
                  CUstream s) \
    { (void)dst; (void)dc; (void)src; (void)sc; (void)s; enqueue(bytes / 1000); return 0; }
COPY_PEER(cuMemcpyPeerAsync)
COPY_PEER(cuMemcpyPeerAsync_ptsz)

#define COPY_BATCH(name) \
    CUresult name(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count, \
                  void *attrs, size_t *attr_idxs, size_t num_attrs, size_t *fail_idx, \
                  CUstream s) \
    { (void)dsts; (void)srcs; (void)attrs; (void)attr_idxs; (void)num_attrs; \
      (void)fail_idx; (void)s; size_t b = 0; for (size_t i = 0; i < count; i++) b += sizes[i]; \
      enqueue(b / 1000); return 0; }
COPY_BATCH(cuMemcpyBatchAsync)
COPY_BATCH(cuMemcpyBatchAsync_ptsz)
COPY_BATCH(cuMemcpyBatchAsync_v2)
COPY_BATCH(cuMemcpyBatchAsync_v2_ptsz)

#define COPY_SYNC(name) \
    CUresult name(CUdeviceptr dst, CUdeviceptr src, size_t bytes) \
    { (void)dst; (void)src; enqueue(bytes / 1000); drain(); return 0; }
COPY_SYNC(cuMemcpy)
COPY_SYNC(cuMemcpy_ptds)
COPY_SYNC(cuMemcpyHtoD_v2)
COPY_SYNC(cuMemcpyHtoD_v2_ptds)
COPY_SYNC(cuMemcpyDtoH_v2)
COPY_SYNC(cuMemcpyDtoH_v2_ptds)
COPY_SYNC(cuMemcpyDtoD_v2)
COPY_SYNC(cuMemcpyDtoD_v2_ptds)

CUresult cuCtxSynchronize(void) { drain(); return 0; }
CUresult cuCtxSynchronize_v2(CUcontext ctx) { (void)ctx; drain(); return 0; }
CUresult cuStreamSynchronize(CUstream s) { (void)s; drain(); return 0; }
CUresult cuStreamSynchronize_ptsz(CUstream s) { (void)s; drain(); return 0; }
CUresult cuEventSynchronize(CUevent e) { (void)e; drain(); return 0; }
