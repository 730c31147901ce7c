/*
 * Thin C layer over libucp for kvpool.
 *
 * Why C and not Python: the hot loops (issue many one-sided operations, flush, wait on the
 * worker's event fd until a deadline) must run without the GIL and without per-operation
 * Python overhead. Everything here is called through cffi, which releases the GIL for the
 * duration of each call. No function here blocks without a deadline, except
 * kv_progress_loop, which returns when its stop fd becomes readable.
 */
#include <ucp/api/ucp.h>
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-compare" /* (in UCX's inline helpers it brings in) */
#include <ucs/debug/log_def.h>
#pragma GCC diagnostic pop
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef KV_SPIN_SECONDS
#define KV_SPIN_SECONDS 20e-6
#endif

typedef struct {
    ucp_ep_h ep;
    ucp_rkey_h rkey;
    void *local;
    uint64_t remote;
    size_t length;
    ucp_mem_h memh;
} kv_op_t;

static double kv_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const char *kv_status_string(int status)
{
    return ucs_status_string((ucs_status_t)status);
}

static int kv_context_create(ucp_context_h *out, const char **keys, const char **values, size_t n)
{
    ucp_config_t *config;
    ucp_params_t params;
    ucs_status_t status;
    size_t i;

    status = ucp_config_read(NULL, NULL, &config);
    if (status != UCS_OK) {
        return status;
    }
    for (i = 0; i < n; i++) {
        status = ucp_config_modify(config, keys[i], values[i]);
        if (status != UCS_OK) {
            ucp_config_release(config);
            return status;
        }
    }
    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED |
                        UCP_PARAM_FIELD_NAME;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
    params.mt_workers_shared = 1;
    params.name = "kvpool";
    status = ucp_init(&params, config, out);
    ucp_config_release(config);
    return status;
}

static void kv_context_destroy(ucp_context_h context)
{
    ucp_cleanup(context);
}

static int kv_worker_create(ucp_context_h context, ucp_worker_h *out, int *efd)
{
    ucp_worker_params_t params;
    ucs_status_t status;

    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_EVENTS;
    params.thread_mode = UCS_THREAD_MODE_SINGLE;
    params.events = UCP_WAKEUP_RMA | UCP_WAKEUP_AMO | UCP_WAKEUP_TX | UCP_WAKEUP_RX;
    status = ucp_worker_create(context, &params, out);
    if (status != UCS_OK) {
        return status;
    }
    status = ucp_worker_get_efd(*out, efd);
    if (status != UCS_OK) {
        ucp_worker_destroy(*out);
    }
    return status;
}

static void kv_worker_destroy(ucp_worker_h worker)
{
    ucp_worker_destroy(worker);
}

static int kv_worker_address(ucp_worker_h worker, void **buf, size_t *len)
{
    ucp_address_t *address;
    ucs_status_t status = ucp_worker_get_address(worker, &address, len);
    *buf = address;
    return status;
}

static void kv_worker_address_release(ucp_worker_h worker, void *buf)
{
    ucp_worker_release_address(worker, (ucp_address_t *)buf);
}

/* One wait step. Progresses the worker, spinning briefly; then arms its event fd. The first
 * idle step of a wait returns right after arming (*armed is set): arming itself completes
 * some operations (a shared-memory flush is one), so the caller re-checks its requests
 * before the next step sleeps on the event fd until the deadline (at most max_sleep s).
 * Returns 0, or a negative errno from poll. */
static int kv_wait_step(ucp_worker_h worker, int efd, double deadline, double max_sleep,
                        int *armed)
{
    struct pollfd pfd;
    double remaining;
    double spin_until = kv_now() + KV_SPIN_SECONDS;
    ucs_status_t status;
    int timeout_ms;

    do {
        if (ucp_worker_progress(worker) != 0) {
            *armed = 0;
            return 0;
        }
    } while (kv_now() < spin_until);
    status = ucp_worker_arm(worker);
    if (status == UCS_ERR_BUSY) {
        *armed = 0;
        return 0;
    }
    if (status != UCS_OK) {
        return status;
    }
    if (!*armed) {
        *armed = 1;
        return 0;
    }
    remaining = deadline - kv_now();
    if (remaining > max_sleep) {
        remaining = max_sleep;
    }
    if (remaining <= 0) {
        return 0;
    }
    timeout_ms = (int)(remaining * 1000.0) + 1;
    pfd.fd = efd;
    pfd.events = POLLIN;
    pfd.revents = 0;
    if (poll(&pfd, 1, timeout_ms) < 0 && errno != EINTR) {
        return -errno;
    }
    return 0;
}

/* Waits for a request returned by a *_nbx call. Returns its final status, or
 * UCS_ERR_TIMED_OUT (the request is then left to complete on its own and freed then). */
static int kv_wait_request(ucp_worker_h worker, int efd, void *request, double deadline)
{
    ucs_status_t status;
    int armed = 0;

    if (request == NULL) {
        return UCS_OK;
    }
    if (UCS_PTR_IS_ERR(request)) {
        return UCS_PTR_STATUS(request);
    }
    for (;;) {
        status = ucp_request_check_status(request);
        if (status != UCS_INPROGRESS) {
            ucp_request_free(request);
            return status;
        }
        if (kv_now() >= deadline) {
            ucp_request_free(request);
            return UCS_ERR_TIMED_OUT;
        }
        kv_wait_step(worker, efd, deadline, 0.05, &armed);
    }
}

static int kv_ep_create(ucp_worker_h worker, const void *address, int peer_errors,
                        ucp_ep_h *out)
{
    ucp_ep_params_t params;

    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    params.address = (const ucp_address_t *)address;
    /* Peer error handling lets an endpoint be force-closed (cancelling its operations), but
     * it forces software RMA and rules out shared memory. So it is used only for peers
     * reached over the network; same-host peers use CMA, whose copies our own progress
     * performs and which never wait on the peer. */
    if (peer_errors) {
        params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
        params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    }
    return ucp_ep_create(worker, &params, out);
}

/* 1 when one of the endpoint's lanes uses the named transport (e.g. "cma"), else 0. */
static int kv_ep_uses_transport(ucp_ep_h ep, const char *name)
{
    ucp_transport_entry_t entries[32];
    ucp_ep_attr_t attr;
    unsigned i;

    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_EP_ATTR_FIELD_TRANSPORTS;
    attr.transports.entries = entries;
    attr.transports.num_entries = 32;
    attr.transports.entry_size = sizeof(entries[0]);
    if (ucp_ep_query(ep, &attr) != UCS_OK) {
        return 0;
    }
    for (i = 0; i < attr.transports.num_entries; i++) {
        if (entries[i].transport_name != NULL && strcmp(entries[i].transport_name, name) == 0) {
            return 1;
        }
    }
    return 0;
}

/* Force-closes an endpoint created with peer error handling, cancelling its operations;
 * UCS_ERR_INVALID_PARAM for one without (UCX allows no forced close then). */
static int kv_ep_force_close(ucp_worker_h worker, int efd, ucp_ep_h ep)
{
    ucp_request_param_t param;
    void *request;

    memset(&param, 0, sizeof(param));
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    request = ucp_ep_close_nbx(ep, &param);
    if (UCS_PTR_IS_ERR(request)) {
        return UCS_PTR_STATUS(request);
    }
    kv_wait_request(worker, efd, request, kv_now() + 1.0);
    return UCS_OK;
}

/* Closes an endpoint. One with peer error handling is force-closed: its outstanding
 * operations are cancelled and never touch local memory again. Without peer error handling
 * UCX refuses a forced close, so the endpoint is flushed and closed instead, which waits for
 * the peer (bounded by the timeout). */
static int kv_ep_close(ucp_worker_h worker, int efd, ucp_ep_h ep, double timeout)
{
    ucp_request_param_t param;
    int status = kv_ep_force_close(worker, efd, ep);

    if (status != UCS_ERR_INVALID_PARAM) {
        return status;
    }
    memset(&param, 0, sizeof(param));
    return kv_wait_request(worker, efd, ucp_ep_close_nbx(ep, &param), kv_now() + timeout);
}

static int kv_mem_map(ucp_context_h context, void *address, size_t length, ucp_mem_h *out)
{
    ucp_mem_map_params_t params;

    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    params.address = address;
    params.length = length;
    return ucp_mem_map(context, &params, out);
}

static int kv_mem_unmap(ucp_context_h context, ucp_mem_h memh)
{
    return ucp_mem_unmap(context, memh);
}

static int kv_rkey_pack(ucp_context_h context, ucp_mem_h memh, void **buf, size_t *len)
{
    return ucp_rkey_pack(context, memh, buf, len);
}

static void kv_rkey_buffer_release(void *buf)
{
    ucp_rkey_buffer_release(buf);
}

static int kv_rkey_unpack(ucp_ep_h ep, const void *buf, ucp_rkey_h *out)
{
    return ucp_ep_rkey_unpack(ep, buf, out);
}

static void kv_rkey_destroy(ucp_rkey_h rkey)
{
    ucp_rkey_destroy(rkey);
}

/* Starts a flush on each endpoint (remote completion of the puts issued on it). */
static void kv_flush_eps(ucp_worker_h worker, ucp_ep_h *eps, size_t n_eps, void **flushes,
                         int *flush_status)
{
    ucp_request_param_t param;
    void *request;
    size_t j;

    (void)worker;
    for (j = 0; j < n_eps; j++) {
        memset(&param, 0, sizeof(param));
        request = ucp_ep_flush_nbx(eps[j], &param);
        if (request == NULL) {
            flush_status[j] = UCS_OK;
        } else if (UCS_PTR_IS_ERR(request)) {
            flush_status[j] = UCS_PTR_STATUS(request);
        } else {
            flush_status[j] = UCS_INPROGRESS;
            flushes[j] = request;
        }
    }
}

/*
 * Runs n one-sided operations (all puts or all gets) to completion before the deadline.
 * Puts are complete when the remote side holds the bytes (each endpoint is flushed).
 *
 * status[i] receives op i's final status. Returns UCS_OK when every op succeeded, the first
 * error otherwise. On a timeout, every endpoint that still has work pending is force-closed
 * (so no operation can touch local memory after this returns) and written to closed[],
 * *n_closed their count; the caller must forget those endpoints and their rkeys.
 */
static int kv_transfer(ucp_worker_h worker, int efd, int is_get, kv_op_t *ops, size_t n,
                       double timeout, double grace, int *status, ucp_ep_h *closed,
                       size_t *n_closed, int *tainted)
{
    ucp_request_param_t param;
    void **requests;
    ucp_ep_h *eps;       /* distinct endpoints (puts: each gets a flush) */
    void **flushes;      /* flush request per distinct endpoint */
    int *flush_status;
    size_t *op_ep;       /* index into eps for each op */
    size_t n_eps = 0, i, j, pending;
    double deadline = kv_now() + timeout;
    int result = UCS_OK;
    int armed = 0;
    int flushed = 0;
    void *request;

    *n_closed = 0;
    *tainted = 0;
    requests = calloc(n ? n : 1, sizeof(void *));
    eps = calloc(n ? n : 1, sizeof(ucp_ep_h));
    flushes = calloc(n ? n : 1, sizeof(void *));
    flush_status = calloc(n ? n : 1, sizeof(int));
    op_ep = calloc(n ? n : 1, sizeof(size_t));
    if (!requests || !eps || !flushes || !flush_status || !op_ep) {
        free(requests); free(eps); free(flushes); free(flush_status); free(op_ep);
        return UCS_ERR_NO_MEMORY;
    }

    for (i = 0; i < n; i++) {
        for (j = 0; j < n_eps && eps[j] != ops[i].ep; j++) {
        }
        if (j == n_eps) {
            eps[n_eps++] = ops[i].ep;
        }
        op_ep[i] = j;

        memset(&param, 0, sizeof(param));
        if (ops[i].memh != NULL) {
            param.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
            param.memh = ops[i].memh;
        }
        if (is_get) {
            request = ucp_get_nbx(ops[i].ep, ops[i].local, ops[i].length, ops[i].remote,
                                  ops[i].rkey, &param);
        } else {
            request = ucp_put_nbx(ops[i].ep, ops[i].local, ops[i].length, ops[i].remote,
                                  ops[i].rkey, &param);
        }
        if (request == NULL) {
            status[i] = UCS_OK;
        } else if (UCS_PTR_IS_ERR(request)) {
            status[i] = UCS_PTR_STATUS(request);
        } else {
            status[i] = UCS_INPROGRESS;
            requests[i] = request;
        }
    }
    for (;;) {
        pending = 0;
        for (i = 0; i < n; i++) {
            if (requests[i] != NULL) {
                ucs_status_t st = ucp_request_check_status(requests[i]);
                if (st == UCS_INPROGRESS) {
                    pending++;
                } else {
                    status[i] = st;
                    ucp_request_free(requests[i]);
                    requests[i] = NULL;
                }
            }
        }
        for (j = 0; j < n_eps; j++) {
            if (flushes[j] != NULL) {
                ucs_status_t st = ucp_request_check_status(flushes[j]);
                if (st == UCS_INPROGRESS) {
                    pending++;
                } else {
                    flush_status[j] = st;
                    ucp_request_free(flushes[j]);
                    flushes[j] = NULL;
                }
            }
        }
        if (pending == 0 && !is_get && !flushed) {
            /* Puts completed locally; now ask for remote completion. Flushing only after the
             * puts finish keeps the flush from slowing down shared-memory copies. */
            flushed = 1;
            kv_flush_eps(worker, eps, n_eps, flushes, flush_status);
            continue;
        }
        if (pending == 0 || kv_now() >= deadline) {
            break;
        }
        kv_wait_step(worker, efd, deadline, 0.05, &armed);
    }

    if (pending != 0) {
        /* Deadline passed, and nothing may touch local memory once we return. An endpoint
         * with peer error handling is force-closed, which cancels its operations. One
         * without it (same host: CMA, whose copies only our own progress performs, and
         * which never waits on the peer) refuses a forced close: it is drained instead,
         * progressing until its operations finish, for at most `grace` more seconds. Either
         * way the operations count as timed out. Anything still in flight after that sets
         * *tainted: the caller must never progress this worker again. */
        for (j = 0; j < n_eps; j++) {
            int stuck = flushes[j] != NULL;
            for (i = 0; i < n && !stuck; i++) {
                stuck = requests[i] != NULL && op_ep[i] == j;
            }
            if (stuck && kv_ep_force_close(worker, efd, eps[j]) == UCS_OK) {
                closed[(*n_closed)++] = eps[j];
            }
        }
        deadline = kv_now() + grace;
        armed = 0;
        for (;;) {
            pending = 0;
            for (i = 0; i < n; i++) {
                if (requests[i] != NULL) {
                    if (ucp_request_check_status(requests[i]) == UCS_INPROGRESS) {
                        pending++;
                    } else {
                        ucp_request_free(requests[i]);
                        requests[i] = NULL;
                        status[i] = UCS_ERR_TIMED_OUT;
                    }
                }
            }
            for (j = 0; j < n_eps; j++) {
                if (flushes[j] != NULL) {
                    if (ucp_request_check_status(flushes[j]) == UCS_INPROGRESS) {
                        pending++;
                    } else {
                        ucp_request_free(flushes[j]);
                        flushes[j] = NULL;
                        flush_status[j] = UCS_ERR_TIMED_OUT;
                    }
                }
            }
            if (pending == 0 || kv_now() >= deadline) {
                break;
            }
            kv_wait_step(worker, efd, deadline, 0.05, &armed);
        }
        for (i = 0; i < n; i++) {
            if (requests[i] != NULL) {
                status[i] = UCS_ERR_TIMED_OUT;
                ucp_request_free(requests[i]);
                *tainted = 1;
            }
        }
        for (j = 0; j < n_eps; j++) {
            if (flushes[j] != NULL) {
                flush_status[j] = UCS_ERR_TIMED_OUT;
                ucp_request_free(flushes[j]);
                *tainted = 1;
            }
        }
    }

    for (i = 0; i < n; i++) {
        if (!is_get && status[i] == UCS_OK && flush_status[op_ep[i]] != UCS_OK) {
            status[i] = flush_status[op_ep[i]];
        }
        if (status[i] != UCS_OK && result == UCS_OK) {
            result = status[i];
        }
    }
    free(requests); free(eps); free(flushes); free(flush_status); free(op_ep);
    return result;
}

/* Progresses the worker until stop_fd becomes readable, sleeping on the worker's event fd
 * when idle (no busy spin). This is what lets TCP's software RMA complete on a target. */
static int kv_progress_loop(ucp_worker_h worker, int efd, int stop_fd)
{
    struct pollfd fds[2];
    ucs_status_t status;

    for (;;) {
        while (ucp_worker_progress(worker) != 0) {
        }
        status = ucp_worker_arm(worker);
        if (status == UCS_ERR_BUSY) {
            continue;
        }
        if (status != UCS_OK) {
            return status;
        }
        fds[0].fd = efd;
        fds[0].events = POLLIN;
        fds[0].revents = 0;
        fds[1].fd = stop_fd;
        fds[1].events = POLLIN;
        fds[1].revents = 0;
        if (poll(fds, 2, -1) < 0 && errno != EINTR) {
            return -errno;
        }
        if (fds[1].revents != 0) {
            return UCS_OK;
        }
    }
}

static unsigned kv_worker_progress(ucp_worker_h worker)
{
    return ucp_worker_progress(worker);
}

/*
 * UCX's own log lines. UCX prints its errors and warnings (e.g. "mm_sysv.c:61 UCX ERROR
 * shmat(...) failed" when a same-host peer has died) straight onto the process's stdout,
 * which is the caller's terminal in a client. kv_log_install puts a handler in front of
 * UCX's: it formats each message into a bounded ring (messages that find it full are only
 * counted) and, when the ring stops being empty, writes one byte to notify_fd; Python drains
 * the ring into kvpool's structured log (kvpool/transport/ucx_log.py). One source line of
 * UCX's holds at most KV_LOG_SAME entries of the ring at a time (further messages from it only
 * count as its newest entry's repeats), so that a storm of one message leaves room for the
 * others. UCX may log from any thread, its own async thread included, so the ring is guarded by a flag that is only ever
 * tried (a message that cannot get it within a bounded number of tries is dropped, and
 * counted): no thread ever blocks inside a log call. FATAL messages also go to UCX's own
 * handler, which prints them before UCX aborts the process.
 */
#define KV_LOG_SLOTS 128
#define KV_LOG_TEXT 480
#define KV_LOG_FILE 64
#define KV_LOG_TRIES 1000
#define KV_LOG_SAME 8

typedef struct {
    int level;
    unsigned line;
    unsigned repeats; /* messages from the same source line after this one, not kept */
    char file[KV_LOG_FILE];
    char text[KV_LOG_TEXT];
} kv_log_entry_t;

static kv_log_entry_t kv_log_ring[KV_LOG_SLOTS];
static size_t kv_log_first;     /* index of the oldest entry */
static size_t kv_log_count;     /* entries held */
static uint64_t kv_log_dropped; /* messages lost since the last take: ring full or busy */
static int kv_log_busy;         /* the ring's guard, taken with __atomic_test_and_set */
static int kv_log_fd = -1;      /* written to when the ring stops being empty */
static int kv_log_also_ucx;     /* let UCX's own handler print too (UCX_LOG_FILE was set) */
static int kv_log_installed;

static int kv_log_lock(void)
{
    int tries;

    for (tries = 0; __atomic_test_and_set(&kv_log_busy, __ATOMIC_ACQUIRE); tries++) {
        if (tries >= KV_LOG_TRIES) {
            return 0;
        }
        sched_yield();
    }
    return 1;
}

static void kv_log_unlock(void)
{
    __atomic_clear(&kv_log_busy, __ATOMIC_RELEASE);
}

static ucs_log_func_rc_t kv_log_handler(const char *file, unsigned line, const char *function,
                                        ucs_log_level_t level,
                                        const ucs_log_component_config_t *comp_conf,
                                        const char *format, va_list ap)
{
    ucs_log_func_rc_t pass = kv_log_also_ucx || level == UCS_LOG_LEVEL_FATAL
                                 ? UCS_LOG_FUNC_RC_CONTINUE
                                 : UCS_LOG_FUNC_RC_STOP;
    kv_log_entry_t *entry, *same = NULL;
    char base[KV_LOG_FILE];
    const char *slash = file != NULL ? strrchr(file, '/') : NULL;
    size_t k, n_same = 0;
    int was_empty;
    va_list copy;
    char byte = 1;

    (void)function;
    (void)comp_conf;
    snprintf(base, sizeof(base), "%s", slash != NULL ? slash + 1 : file != NULL ? file : "");
    if (!kv_log_lock()) {
        __atomic_add_fetch(&kv_log_dropped, 1, __ATOMIC_RELAXED);
        return pass;
    }
    for (k = 0; k < kv_log_count; k++) {
        entry = &kv_log_ring[(kv_log_first + k) % KV_LOG_SLOTS];
        if (entry->line == line && strcmp(entry->file, base) == 0) {
            same = entry;
            n_same++;
        }
    }
    if (n_same >= KV_LOG_SAME) {
        same->repeats++;
        kv_log_unlock();
        return pass;
    }
    if (kv_log_count == KV_LOG_SLOTS) {
        __atomic_add_fetch(&kv_log_dropped, 1, __ATOMIC_RELAXED);
        kv_log_unlock();
        return pass;
    }
    entry = &kv_log_ring[(kv_log_first + kv_log_count) % KV_LOG_SLOTS];
    memcpy(entry->file, base, sizeof(base));
    entry->repeats = 0;
    entry->line = line;
    entry->level = (int)level;
    va_copy(copy, ap);
    vsnprintf(entry->text, sizeof(entry->text), format, copy);
    va_end(copy);
    was_empty = kv_log_count == 0;
    kv_log_count++;
    kv_log_unlock();
    if (was_empty && kv_log_fd >= 0) {
        /* non-blocking: a full pipe already holds a wake-up */
        if (write(kv_log_fd, &byte, 1) < 0) {
        }
    }
    return pass;
}

/* Routes UCX's log lines into the ring from now on (once per process; later calls only
 * change notify_fd and also_ucx, and empty the ring, as a child does after fork). */
static void kv_log_install(int notify_fd, int also_ucx)
{
    __atomic_clear(&kv_log_busy, __ATOMIC_RELEASE);
    kv_log_first = 0;
    kv_log_count = 0;
    kv_log_dropped = 0;
    kv_log_fd = notify_fd;
    kv_log_also_ucx = also_ucx;
    if (!kv_log_installed) {
        kv_log_installed = 1;
        ucs_log_push_handler(kv_log_handler);
    }
}

/* Moves up to max of the oldest entries into out; returns how many, and in *dropped the
 * messages lost since the last call. */
static size_t kv_log_take(kv_log_entry_t *out, size_t max, uint64_t *dropped)
{
    size_t n = 0;

    *dropped = 0;
    if (!kv_log_lock()) {
        return 0;
    }
    while (n < max && kv_log_count > 0) {
        out[n++] = kv_log_ring[kv_log_first];
        kv_log_first = (kv_log_first + 1) % KV_LOG_SLOTS;
        kv_log_count--;
    }
    *dropped = __atomic_exchange_n(&kv_log_dropped, 0, __ATOMIC_RELAXED);
    kv_log_unlock();
    return n;
}

/* Logs one message through UCX's log dispatch, as from source line `line` of a file of
 * UCX's: for tests. */
static void kv_log_emit(int level, unsigned line, const char *text)
{
    ucs_log_dispatch("src/ucs/kv_log_emit.c", line, "kv_log_emit", (ucs_log_level_t)level,
                     &ucs_global_opts.log_component, "%s", text);
}

/* ======================================================================================
 * Contexts with a chosen feature set.
 *
 * kv_context_create asks for RMA: one-sided put/get into registered memory. A storage node
 * that must not let peers read or write its memory directly asks for active messages only
 * (KV_FEATURE_AM without KV_FEATURE_RMA): UCP then registers no handler for software RMA
 * (a peer's emulated put or get over TCP is dropped as an unknown message), and every byte
 * goes through a request the node checks (kv_am_server below).
 */
#define KV_FEATURE_RMA 1
#define KV_FEATURE_AM 2

static int kv_context_create_features(ucp_context_h *out, const char **keys,
                                      const char **values, size_t n, int features)
{
    ucp_config_t *config;
    ucp_params_t params;
    ucs_status_t status;
    size_t i;

    if (features == 0 || (features & ~(KV_FEATURE_RMA | KV_FEATURE_AM)) != 0) {
        return UCS_ERR_INVALID_PARAM;
    }
    status = ucp_config_read(NULL, NULL, &config);
    if (status != UCS_OK) {
        return status;
    }
    for (i = 0; i < n; i++) {
        status = ucp_config_modify(config, keys[i], values[i]);
        if (status != UCS_OK) {
            ucp_config_release(config);
            return status;
        }
    }
    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED |
                        UCP_PARAM_FIELD_NAME;
    params.features = UCP_FEATURE_WAKEUP;
    if (features & KV_FEATURE_RMA) {
        params.features |= UCP_FEATURE_RMA;
    }
    if (features & KV_FEATURE_AM) {
        params.features |= UCP_FEATURE_AM;
    }
    params.mt_workers_shared = 1;
    params.name = "kvpool";
    status = ucp_init(&params, config, out);
    ucp_config_release(config);
    return status;
}

/* ======================================================================================
 * SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104), for checking capabilities on the node's
 * progress thread without the GIL and without a dependency on a crypto library at build
 * time. security/capabilities.py signs and checks the same bytes with Python's hmac; the
 * unit tests compare the two on generated inputs.
 */
typedef struct {
    uint32_t h[8];
    uint64_t bytes;
    uint8_t block[64];
    size_t used;
} kv_sha256_t;

static const uint32_t kv_sha256_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

#define KV_ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void kv_sha256_compress(uint32_t *h, const uint8_t *p)
{
    uint32_t w[64], a, b, c, d, e, f, g, k, t1, t2;
    int i;

    for (i = 0; i < 16; i++) {
        w[i] = ((uint32_t)p[4 * i] << 24) | ((uint32_t)p[4 * i + 1] << 16) |
               ((uint32_t)p[4 * i + 2] << 8) | (uint32_t)p[4 * i + 3];
    }
    for (i = 16; i < 64; i++) {
        uint32_t s0 = KV_ROR(w[i - 15], 7) ^ KV_ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = KV_ROR(w[i - 2], 17) ^ KV_ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    a = h[0]; b = h[1]; c = h[2]; d = h[3]; e = h[4]; f = h[5]; g = h[6]; k = h[7];
    for (i = 0; i < 64; i++) {
        t1 = k + (KV_ROR(e, 6) ^ KV_ROR(e, 11) ^ KV_ROR(e, 25)) + ((e & f) ^ (~e & g)) +
             kv_sha256_k[i] + w[i];
        t2 = (KV_ROR(a, 2) ^ KV_ROR(a, 13) ^ KV_ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += k;
}

static void kv_sha256_init(kv_sha256_t *s)
{
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, iv, sizeof(iv));
    s->bytes = 0;
    s->used = 0;
}

static void kv_sha256_update(kv_sha256_t *s, const uint8_t *p, size_t n)
{
    s->bytes += n;
    while (n > 0) {
        size_t take = 64 - s->used < n ? 64 - s->used : n;
        memcpy(s->block + s->used, p, take);
        s->used += take;
        p += take;
        n -= take;
        if (s->used == 64) {
            kv_sha256_compress(s->h, s->block);
            s->used = 0;
        }
    }
}

static void kv_sha256_final(kv_sha256_t *s, uint8_t *out)
{
    uint64_t bits = s->bytes * 8;
    uint8_t pad = 0x80, zero = 0, len[8];
    int i;

    kv_sha256_update(s, &pad, 1);
    while (s->used != 56) {
        kv_sha256_update(s, &zero, 1);
    }
    for (i = 0; i < 8; i++) {
        len[i] = (uint8_t)(bits >> (56 - 8 * i));
    }
    kv_sha256_update(s, len, 8);
    for (i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(s->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)s->h[i];
    }
}

/* An HMAC key with its inner and outer pads already absorbed: a check then costs three
 * compressions. */
typedef struct {
    int in_use;
    uint16_t id;
    kv_sha256_t inner;
    kv_sha256_t outer;
} kv_hmac_key_t;

static void kv_hmac_key_init(kv_hmac_key_t *k, uint16_t id, const uint8_t *key, size_t len)
{
    uint8_t block[64], digest[32];
    kv_sha256_t s;
    int i;

    memset(block, 0, sizeof(block));
    if (len > 64) {
        kv_sha256_init(&s);
        kv_sha256_update(&s, key, len);
        kv_sha256_final(&s, digest);
        memcpy(block, digest, 32);
    } else {
        memcpy(block, key, len);
    }
    for (i = 0; i < 64; i++) {
        block[i] ^= 0x36;
    }
    kv_sha256_init(&k->inner);
    kv_sha256_update(&k->inner, block, 64);
    for (i = 0; i < 64; i++) {
        block[i] ^= 0x36 ^ 0x5c;
    }
    kv_sha256_init(&k->outer);
    kv_sha256_update(&k->outer, block, 64);
    memset(block, 0, sizeof(block));
    k->id = id;
    k->in_use = 1;
}

static void kv_hmac(const kv_hmac_key_t *k, const uint8_t *a, size_t na, const uint8_t *b,
                    size_t nb, uint8_t *out)
{
    kv_sha256_t s = k->inner;
    uint8_t digest[32];

    kv_sha256_update(&s, a, na);
    kv_sha256_update(&s, b, nb);
    kv_sha256_final(&s, digest);
    s = k->outer;
    kv_sha256_update(&s, digest, 32);
    kv_sha256_final(&s, out);
}

/* For tests: HMAC-SHA256 of a message under a key, in one call. */
static void kv_hmac_sha256(const uint8_t *key, size_t key_len, const uint8_t *msg, size_t n,
                           uint8_t *out)
{
    kv_hmac_key_t k;

    kv_hmac_key_init(&k, 0, key, key_len);
    kv_hmac(&k, msg, n, NULL, 0, out);
}

/* ======================================================================================
 * Capabilities: the master's signed permission to touch one range of one segment.
 * The layout and every rule are those of security/capabilities.py (the reference; keep the
 * two in step, the unit tests compare them): big-endian fields
 *   0 version u8 | 1 rights u8 | 2 key id u16 | 4 tenant digest [8] | 12 segment digest [16]
 *   28 offset u64 | 36 length u64 | 44 expiry (ms, master's wall clock) u64 | 52 term u64
 *   60 grant id u64 | 68 tag [16] = HMAC-SHA256(key, domain || bytes 0..67) truncated
 * Checks, in this order (the first failing one is reported): size, version, rights bits,
 * length and range arithmetic (malformed), key id (unknown key), tag (forged), term (stale),
 * expiry (expired), segment and range (out of range), rights (wrong rights).
 */
#define KV_CAP_VERSION 1
#define KV_CAP_LEN 84
#define KV_CAP_SIGNED 68
#define KV_CAP_TAG 16
#define KV_CAP_DOMAIN "kvpool capability v1"
#define KV_CAP_MAX_KEYS 4
#define KV_RIGHT_READ 1
#define KV_RIGHT_WRITE 2

#define KV_CAP_OK 0
#define KV_CAP_MALFORMED 1
#define KV_CAP_UNKNOWN_KEY 2
#define KV_CAP_FORGED 3
#define KV_CAP_STALE_TERM 4
#define KV_CAP_EXPIRED 5
#define KV_CAP_OUT_OF_RANGE 6
#define KV_CAP_WRONG_RIGHTS 7
/* Refusals of the active-message path that are not about the capability. */
#define KV_AM_BAD_REQUEST 20
#define KV_AM_NO_SEGMENT 21
#define KV_AM_BUSY 22
#define KV_AM_FAILED 23
#define KV_AM_BAD_REPLY 24
#define KV_AM_NCODES 32
/* A refusal travels to Python as KV_AM_REFUSED + its code (UCX statuses are <= 0). */
#define KV_AM_REFUSED 1000

static uint64_t kv_be64(const uint8_t *p)
{
    uint64_t v = 0;
    int i;

    for (i = 0; i < 8; i++) {
        v = (v << 8) | p[i];
    }
    return v;
}

static void kv_put_be64(uint8_t *p, uint64_t v)
{
    int i;

    for (i = 7; i >= 0; i--) {
        p[i] = (uint8_t)v;
        v >>= 8;
    }
}

static void kv_put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static uint32_t kv_be32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

typedef struct {
    const kv_hmac_key_t *keys; /* KV_CAP_MAX_KEYS slots */
    uint64_t min_term;
    uint64_t now_ms;  /* the master's wall clock as this node estimates it */
    uint64_t skew_ms; /* how far that estimate may be behind */
} kv_cap_policy_t;

/* Checks a capability for `length` bytes at `offset` of the segment with `digest`, needing
 * `rights`. Returns KV_CAP_OK or the first failing check's code. */
static int kv_cap_check_core(const kv_cap_policy_t *policy, const uint8_t *cap, size_t cap_len,
                             const uint8_t *digest, uint64_t offset, uint64_t length,
                             int rights)
{
    uint8_t tag[32];
    uint64_t c_offset, c_length, expiry;
    const kv_hmac_key_t *key = NULL;
    unsigned diff = 0;
    uint16_t key_id;
    int i;

    if (cap_len != KV_CAP_LEN || cap[0] != KV_CAP_VERSION || cap[1] == 0 ||
        (cap[1] & ~(KV_RIGHT_READ | KV_RIGHT_WRITE)) != 0) {
        return KV_CAP_MALFORMED;
    }
    c_offset = kv_be64(cap + 28);
    c_length = kv_be64(cap + 36);
    if (c_length == 0 || c_offset > UINT64_MAX - c_length) {
        return KV_CAP_MALFORMED;
    }
    key_id = (uint16_t)((cap[2] << 8) | cap[3]);
    for (i = 0; i < KV_CAP_MAX_KEYS; i++) {
        if (policy->keys[i].in_use && policy->keys[i].id == key_id) {
            key = &policy->keys[i];
        }
    }
    if (key == NULL) {
        return KV_CAP_UNKNOWN_KEY;
    }
    kv_hmac(key, (const uint8_t *)KV_CAP_DOMAIN, sizeof(KV_CAP_DOMAIN) - 1, cap, KV_CAP_SIGNED,
            tag);
    for (i = 0; i < KV_CAP_TAG; i++) {
        diff |= (unsigned)(tag[i] ^ cap[KV_CAP_SIGNED + i]);
    }
    if (diff != 0) {
        return KV_CAP_FORGED;
    }
    if (kv_be64(cap + 52) < policy->min_term) {
        return KV_CAP_STALE_TERM;
    }
    expiry = kv_be64(cap + 44);
    if (policy->now_ms > expiry && policy->now_ms - expiry > policy->skew_ms) {
        return KV_CAP_EXPIRED;
    }
    if (memcmp(cap + 12, digest, 16) != 0 || length == 0 ||
        offset > UINT64_MAX - length || offset < c_offset ||
        offset + length > c_offset + c_length) {
        return KV_CAP_OUT_OF_RANGE;
    }
    if ((cap[1] & rights) != rights) {
        return KV_CAP_WRONG_RIGHTS;
    }
    return KV_CAP_OK;
}

/* For tests: the check above with explicit keys (n_keys of them, 32 bytes each). */
static int kv_cap_check(const uint8_t *cap, size_t cap_len, const uint16_t *key_ids,
                        const uint8_t *keys, size_t n_keys, uint64_t min_term, uint64_t now_ms,
                        uint64_t skew_ms, const uint8_t *digest, uint64_t offset,
                        uint64_t length, int rights)
{
    kv_hmac_key_t slots[KV_CAP_MAX_KEYS];
    kv_cap_policy_t policy;
    size_t i;

    if (n_keys > KV_CAP_MAX_KEYS) {
        return -1;
    }
    memset(slots, 0, sizeof(slots));
    for (i = 0; i < n_keys; i++) {
        kv_hmac_key_init(&slots[i], key_ids[i], keys + 32 * i, 32);
    }
    policy.keys = slots;
    policy.min_term = min_term;
    policy.now_ms = now_ms;
    policy.skew_ms = skew_ms;
    return kv_cap_check_core(&policy, cap, cap_len, digest, offset, length, rights);
}

/* ======================================================================================
 * The checked data path: active messages with rendezvous.
 *
 * A client asks, the node checks, then bytes move, straight between the client's buffer and
 * the segment (rendezvous: UCX moves them with zero-copy transport operations; small
 * messages go eagerly, copied once out of UCX's receive buffer). Messages:
 *   KV_AM_ID_PUT        client -> node: request header + the bytes
 *   KV_AM_ID_GET        client -> node: request header only
 *   KV_AM_ID_PUT_REPLY  node -> client: reply header (eager puts, and refusals)
 *   KV_AM_ID_GET_DATA   node -> client: reply header + the bytes (or a refusal, no bytes)
 * Request header, big-endian, exactly KV_REQ_LEN bytes: magic u32 | op u8 | 3 zero bytes |
 * request id u64 | offset u64 (from the segment's base) | length u64 | capability [84].
 * Reply header, exactly KV_REPLY_LEN bytes: magic u32 | code u32 | request id u64.
 *
 * The node checks a request in its AM handler, on the progress thread, without the GIL:
 * header, capability (kv_cap_check_core), segment bounds. A put it accepts is received with
 * ucp_am_recv_data_nbx straight into the segment; a get is answered with ucp_am_send_nbx
 * from the segment. Nothing else in the segment table is reachable: a request names a
 * segment only through the digest its capability carries, and an offset inside it.
 * Completion: a put completes at the client when the node's reply arrives, which the node
 * sends once the bytes are in the segment (for a rendezvous put, from the receive's
 * completion: over TCP the sender's own completion comes before the receiver has them all);
 * a get when its bytes have arrived. Every message the node sends holds one of max_inflight slots until it
 * completes, so a client that stops reading cannot make the node queue without bound.
 */
#include <pthread.h>

#define KV_AM_ID_PUT 40
#define KV_AM_ID_GET 41
#define KV_AM_ID_PUT_REPLY 42
#define KV_AM_ID_GET_DATA 43
#define KV_REQ_MAGIC 0x4b565231u   /* "KVR1" */
#define KV_REPLY_MAGIC 0x4b564131u /* "KVA1" */
#define KV_REQ_LEN (32 + KV_CAP_LEN)
#define KV_REPLY_LEN 16
#define KV_OP_PUT 1
#define KV_OP_GET 2
#define KV_AM_MAX_SEGMENTS 64
#define KV_AM_MAX_SLOTS 65536

/* Counters a node reports (kv_am_server_counters): refusals by code at [code], then: */
#define KV_CNT_PUTS (KV_AM_NCODES + 0)
#define KV_CNT_GETS (KV_AM_NCODES + 1)
#define KV_CNT_PUT_BYTES (KV_AM_NCODES + 2)
#define KV_CNT_GET_BYTES (KV_AM_NCODES + 3)
#define KV_CNT_NO_REPLY_EP (KV_AM_NCODES + 4)
#define KV_CNT_COMPLETION_ERRORS (KV_AM_NCODES + 5)
#define KV_CNT_REPLIES_DROPPED (KV_AM_NCODES + 6)
#define KV_AM_NCOUNTERS (KV_AM_NCODES + 8)

#define KV_SEG_FREE 0
#define KV_SEG_ACTIVE 1
#define KV_SEG_DRAINING 2

typedef struct {
    int state;
    uint8_t digest[16];
    uint8_t *base;
    uint64_t length;
    ucp_mem_h memh;
    uint32_t inflight;
} kv_am_segment_t;

typedef struct kv_am_server kv_am_server_t;

typedef struct {
    kv_am_server_t *server;
    int segment; /* -1: a reply that touches no segment */
    int next_free;
    /* a rendezvous put being received: whom to tell when its bytes are in */
    ucp_ep_h reply_ep;
    uint64_t id;
} kv_am_slot_t;

struct kv_am_server {
    ucp_worker_h worker;
    pthread_mutex_t lock;
    kv_hmac_key_t keys[KV_CAP_MAX_KEYS];
    uint64_t min_term;
    int64_t clock_offset_ms;
    uint64_t skew_ms;
    uint64_t rndv_thresh;
    kv_am_segment_t segments[KV_AM_MAX_SEGMENTS];
    kv_am_slot_t *slots;
    int free_slot;
    uint32_t inflight;
    uint64_t counters[KV_AM_NCOUNTERS];
};

typedef struct {
    int op;
    uint64_t id;
    uint64_t offset;
    uint64_t length;
    const uint8_t *cap;
} kv_am_request_t;

static uint64_t kv_wall_ms(int64_t offset_ms)
{
    struct timespec ts;
    int64_t ms;

    clock_gettime(CLOCK_REALTIME, &ts);
    ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + offset_ms;
    return ms < 0 ? 0 : (uint64_t)ms;
}

static int kv_am_parse_request(const void *header, size_t header_length, int op,
                               kv_am_request_t *req)
{
    const uint8_t *h = header;

    req->id = 0;
    if (header == NULL || header_length != KV_REQ_LEN) {
        return KV_AM_BAD_REQUEST;
    }
    req->id = kv_be64(h + 8);
    if (kv_be32(h) != KV_REQ_MAGIC || h[4] != op || h[5] != 0 || h[6] != 0 || h[7] != 0) {
        return KV_AM_BAD_REQUEST;
    }
    req->op = op;
    req->offset = kv_be64(h + 16);
    req->length = kv_be64(h + 24);
    req->cap = h + 32;
    if (req->length == 0 || req->offset > UINT64_MAX - req->length) {
        return KV_AM_BAD_REQUEST;
    }
    return KV_CAP_OK;
}

static int kv_am_slot_take(kv_am_server_t *s, int segment)
{
    int slot = s->free_slot;

    if (slot < 0) {
        return -1;
    }
    s->free_slot = s->slots[slot].next_free;
    s->slots[slot].segment = segment;
    s->inflight++;
    if (segment >= 0) {
        s->segments[segment].inflight++;
    }
    return slot;
}

static void kv_am_slot_give_locked(kv_am_server_t *s, kv_am_slot_t *slot)
{
    int segment = slot->segment;

    if (segment >= 0) {
        kv_am_segment_t *seg = &s->segments[segment];
        seg->inflight--;
        if (seg->inflight == 0 && seg->state == KV_SEG_DRAINING) {
            seg->state = KV_SEG_FREE;
        }
    }
    s->inflight--;
    slot->next_free = s->free_slot;
    s->free_slot = (int)(slot - s->slots);
}

static void kv_am_slot_give(kv_am_server_t *s, kv_am_slot_t *slot)
{
    pthread_mutex_lock(&s->lock);
    kv_am_slot_give_locked(s, slot);
    pthread_mutex_unlock(&s->lock);
}

/* Checks a request against the capability it carries and the segment table. On success
 * returns KV_CAP_OK with *dest the first byte to touch, *memh its registration and *slot a
 * slot held for the transfer (released by its completion). Counts refusals. */
static int kv_am_admit(kv_am_server_t *s, const kv_am_request_t *req, int rights, int *slot,
                       uint8_t **dest, ucp_mem_h *memh)
{
    kv_cap_policy_t policy;
    kv_am_segment_t *seg = NULL;
    int code, i;

    pthread_mutex_lock(&s->lock);
    policy.keys = s->keys;
    policy.min_term = s->min_term;
    policy.now_ms = kv_wall_ms(s->clock_offset_ms);
    policy.skew_ms = s->skew_ms;
    /* The capability's own segment digest is what the request names. */
    code = kv_cap_check_core(&policy, req->cap, KV_CAP_LEN, req->cap + 12, req->offset,
                             req->length, rights);
    if (code == KV_CAP_OK) {
        for (i = 0; i < KV_AM_MAX_SEGMENTS; i++) {
            if (s->segments[i].state == KV_SEG_ACTIVE &&
                memcmp(s->segments[i].digest, req->cap + 12, 16) == 0) {
                seg = &s->segments[i];
                break;
            }
        }
        if (seg == NULL) {
            code = KV_AM_NO_SEGMENT;
        } else if (req->offset > seg->length || req->length > seg->length - req->offset) {
            code = KV_CAP_OUT_OF_RANGE;
        } else if ((*slot = kv_am_slot_take(s, i)) < 0) {
            code = KV_AM_BUSY;
        } else {
            *dest = seg->base + req->offset;
            *memh = seg->memh;
        }
    }
    if (code != KV_CAP_OK) {
        s->counters[code]++;
    }
    pthread_mutex_unlock(&s->lock);
    return code;
}

static void kv_am_server_sent(void *request, ucs_status_t status, void *user_data)
{
    kv_am_slot_t *slot = user_data;

    if (status != UCS_OK) {
        __atomic_add_fetch(&slot->server->counters[KV_CNT_COMPLETION_ERRORS], 1,
                           __ATOMIC_RELAXED);
    }
    kv_am_slot_give(slot->server, slot);
    ucp_request_free(request);
}

static void kv_am_server_reply(kv_am_server_t *s, ucp_ep_h reply_ep, unsigned am_id,
                               uint64_t id, int code, int slot, const void *data,
                               size_t length, ucp_mem_h memh);

/* A rendezvous put's bytes are in the segment: the reply tells the client so, and takes
 * over the slot. The reply endpoint is used only after a successful receive, which UCX
 * completes while that endpoint is alive; after a failed one the client times out. */
static void kv_am_server_received(void *request, ucs_status_t status, size_t length,
                                  void *user_data)
{
    kv_am_slot_t *slot = user_data;
    kv_am_server_t *s = slot->server;

    (void)length;
    if (status == UCS_OK) {
        kv_am_server_reply(s, slot->reply_ep, KV_AM_ID_PUT_REPLY, slot->id, KV_CAP_OK,
                           (int)(slot - s->slots), NULL, 0, NULL);
    } else {
        __atomic_add_fetch(&s->counters[KV_CNT_COMPLETION_ERRORS], 1, __ATOMIC_RELAXED);
        kv_am_slot_give(s, slot);
    }
    ucp_request_free(request);
}

/* Sends a reply header (and, for an accepted get, the bytes) from within an AM handler,
 * while reply_ep is known to be valid. `slot` is held until the send completes (taken here
 * when the caller passes -1). */
static void kv_am_server_reply(kv_am_server_t *s, ucp_ep_h reply_ep, unsigned am_id,
                               uint64_t id, int code, int slot, const void *data,
                               size_t length, ucp_mem_h memh)
{
    uint8_t header[KV_REPLY_LEN];
    ucp_request_param_t param;
    void *request;

    if (slot < 0) {
        pthread_mutex_lock(&s->lock);
        slot = kv_am_slot_take(s, -1);
        pthread_mutex_unlock(&s->lock);
        if (slot < 0) {
            __atomic_add_fetch(&s->counters[KV_CNT_REPLIES_DROPPED], 1, __ATOMIC_RELAXED);
            return;
        }
    }
    kv_put_be32(header, KV_REPLY_MAGIC);
    kv_put_be32(header + 4, (uint32_t)code);
    kv_put_be64(header + 8, id);
    memset(&param, 0, sizeof(param));
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                         UCP_OP_ATTR_FIELD_FLAGS;
    param.cb.send = kv_am_server_sent;
    param.user_data = &s->slots[slot];
    param.flags = UCP_AM_SEND_FLAG_COPY_HEADER;
    if (length > 0) {
        param.flags |= length >= s->rndv_thresh ? UCP_AM_SEND_FLAG_RNDV : UCP_AM_SEND_FLAG_EAGER;
        if (memh != NULL) {
            param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
            param.memh = memh;
        }
    }
    request = ucp_am_send_nbx(reply_ep, am_id, header, sizeof(header), data, length, &param);
    if (request == NULL || UCS_PTR_IS_ERR(request)) {
        if (UCS_PTR_IS_ERR(request)) {
            __atomic_add_fetch(&s->counters[KV_CNT_COMPLETION_ERRORS], 1, __ATOMIC_RELAXED);
        }
        kv_am_slot_give(s, &s->slots[slot]);
    }
}

static ucp_ep_h kv_am_reply_ep(kv_am_server_t *s, const ucp_am_recv_param_t *param)
{
    if ((param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) && param->reply_ep != NULL) {
        return param->reply_ep;
    }
    __atomic_add_fetch(&s->counters[KV_CNT_NO_REPLY_EP], 1, __ATOMIC_RELAXED);
    return NULL;
}

static ucs_status_t kv_am_server_put(void *arg, const void *header, size_t header_length,
                                     void *data, size_t length,
                                     const ucp_am_recv_param_t *param)
{
    kv_am_server_t *s = arg;
    int rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    ucp_ep_h reply_ep = kv_am_reply_ep(s, param);
    ucp_request_param_t recv;
    kv_am_request_t req;
    uint8_t *dest = NULL;
    ucp_mem_h memh = NULL;
    int code, slot = -1;
    void *request;

    code = kv_am_parse_request(header, header_length, KV_OP_PUT, &req);
    if (code == KV_CAP_OK && (length != req.length || reply_ep == NULL)) {
        code = KV_AM_BAD_REQUEST;
    }
    if (code != KV_CAP_OK) {
        pthread_mutex_lock(&s->lock);
        s->counters[code]++;
        pthread_mutex_unlock(&s->lock);
    } else {
        code = kv_am_admit(s, &req, KV_RIGHT_WRITE, &slot, &dest, &memh);
    }
    if (code != KV_CAP_OK) {
        if (reply_ep != NULL) {
            kv_am_server_reply(s, reply_ep, KV_AM_ID_PUT_REPLY, req.id, code, -1, NULL, 0, NULL);
        }
        return rndv ? UCS_ERR_REJECTED : UCS_OK;
    }
    __atomic_add_fetch(&s->counters[KV_CNT_PUTS], 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&s->counters[KV_CNT_PUT_BYTES], length, __ATOMIC_RELAXED);
    if (!rndv) {
        memcpy(dest, data, length);
        /* The reply takes over the slot: the segment counts as in use until it is sent. */
        kv_am_server_reply(s, reply_ep, KV_AM_ID_PUT_REPLY, req.id, KV_CAP_OK, slot, NULL, 0,
                           NULL);
        return UCS_OK;
    }
    memset(&recv, 0, sizeof(recv));
    recv.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    recv.cb.recv_am = kv_am_server_received;
    recv.user_data = &s->slots[slot];
    s->slots[slot].reply_ep = reply_ep;
    s->slots[slot].id = req.id;
    if (memh != NULL) {
        recv.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
        recv.memh = memh;
    }
    request = ucp_am_recv_data_nbx(s->worker, data, dest, length, &recv);
    if (request == NULL) {
        kv_am_server_reply(s, reply_ep, KV_AM_ID_PUT_REPLY, req.id, KV_CAP_OK, slot, NULL, 0,
                           NULL);
    } else if (UCS_PTR_IS_ERR(request)) {
        __atomic_add_fetch(&s->counters[KV_CNT_COMPLETION_ERRORS], 1, __ATOMIC_RELAXED);
        kv_am_slot_give(s, &s->slots[slot]);
        kv_am_server_reply(s, reply_ep, KV_AM_ID_PUT_REPLY, req.id, KV_AM_FAILED, -1, NULL, 0,
                           NULL);
    }
    return UCS_INPROGRESS;
}

static ucs_status_t kv_am_server_get(void *arg, const void *header, size_t header_length,
                                     void *data, size_t length,
                                     const ucp_am_recv_param_t *param)
{
    kv_am_server_t *s = arg;
    int rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    ucp_ep_h reply_ep = kv_am_reply_ep(s, param);
    kv_am_request_t req;
    uint8_t *source = NULL;
    ucp_mem_h memh = NULL;
    int code, slot = -1;

    (void)data;
    code = kv_am_parse_request(header, header_length, KV_OP_GET, &req);
    if (code == KV_CAP_OK && (length != 0 || reply_ep == NULL)) {
        code = KV_AM_BAD_REQUEST;
    }
    if (code != KV_CAP_OK) {
        pthread_mutex_lock(&s->lock);
        s->counters[code]++;
        pthread_mutex_unlock(&s->lock);
    } else {
        code = kv_am_admit(s, &req, KV_RIGHT_READ, &slot, &source, &memh);
    }
    if (reply_ep == NULL) {
        return rndv ? UCS_ERR_REJECTED : UCS_OK;
    }
    if (code != KV_CAP_OK) {
        kv_am_server_reply(s, reply_ep, KV_AM_ID_GET_DATA, req.id, code, -1, NULL, 0, NULL);
        return rndv ? UCS_ERR_REJECTED : UCS_OK;
    }
    __atomic_add_fetch(&s->counters[KV_CNT_GETS], 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&s->counters[KV_CNT_GET_BYTES], req.length, __ATOMIC_RELAXED);
    kv_am_server_reply(s, reply_ep, KV_AM_ID_GET_DATA, req.id, KV_CAP_OK, slot, source,
                       req.length, memh);
    return UCS_OK;
}

static int kv_am_set_handler(ucp_worker_h worker, unsigned id, ucp_am_recv_callback_t cb,
                             void *arg)
{
    ucp_am_handler_param_t param;

    memset(&param, 0, sizeof(param));
    param.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                       UCP_AM_HANDLER_PARAM_FIELD_ARG;
    param.id = id;
    param.cb = cb;
    param.arg = arg;
    return ucp_worker_set_am_recv_handler(worker, &param);
}

/* A node's checked data path on `worker` (whose context has KV_FEATURE_AM): installs the
 * request handlers. max_inflight bounds the messages the node has in flight; replies of
 * rndv_thresh bytes and more go by rendezvous. Keys and segments are added afterwards. */
static int kv_am_server_create(ucp_worker_h worker, uint32_t max_inflight,
                               uint64_t rndv_thresh, kv_am_server_t **out)
{
    kv_am_server_t *s;
    uint32_t i;
    int status;

    if (max_inflight == 0 || max_inflight > KV_AM_MAX_SLOTS) {
        return UCS_ERR_INVALID_PARAM;
    }
    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        return UCS_ERR_NO_MEMORY;
    }
    s->slots = calloc(max_inflight, sizeof(kv_am_slot_t));
    if (s->slots == NULL) {
        free(s);
        return UCS_ERR_NO_MEMORY;
    }
    for (i = 0; i < max_inflight; i++) {
        s->slots[i].server = s;
        s->slots[i].next_free = i + 1 < max_inflight ? (int)(i + 1) : -1;
    }
    s->free_slot = 0;
    s->worker = worker;
    s->rndv_thresh = rndv_thresh;
    pthread_mutex_init(&s->lock, NULL);
    status = kv_am_set_handler(worker, KV_AM_ID_PUT, kv_am_server_put, s);
    if (status == UCS_OK) {
        status = kv_am_set_handler(worker, KV_AM_ID_GET, kv_am_server_get, s);
    }
    if (status != UCS_OK) {
        kv_am_set_handler(worker, KV_AM_ID_PUT, NULL, NULL);
        pthread_mutex_destroy(&s->lock);
        free(s->slots);
        free(s);
        return status;
    }
    *out = s;
    return UCS_OK;
}

/* Removes the handlers. Call from the thread that progresses the worker, or once it has
 * stopped. With messages still in flight the server's memory is left allocated (their
 * completions still refer to it); returns how many were. */
static uint32_t kv_am_server_destroy(kv_am_server_t *s)
{
    uint32_t inflight;

    kv_am_set_handler(s->worker, KV_AM_ID_PUT, NULL, NULL);
    kv_am_set_handler(s->worker, KV_AM_ID_GET, NULL, NULL);
    pthread_mutex_lock(&s->lock);
    inflight = s->inflight;
    memset(s->keys, 0, sizeof(s->keys));
    pthread_mutex_unlock(&s->lock);
    if (inflight == 0) {
        pthread_mutex_destroy(&s->lock);
        free(s->slots);
        free(s);
    }
    return inflight;
}

/* Adds (or replaces) the key with this id; at most KV_CAP_MAX_KEYS are held. */
static int kv_am_server_set_key(kv_am_server_t *s, uint16_t key_id, const uint8_t *key,
                                size_t key_len)
{
    int i, free_i = -1, status = UCS_OK;

    if (key_len != 32) {
        return UCS_ERR_INVALID_PARAM;
    }
    pthread_mutex_lock(&s->lock);
    for (i = 0; i < KV_CAP_MAX_KEYS; i++) {
        if (s->keys[i].in_use && s->keys[i].id == key_id) {
            free_i = i;
            break;
        }
        if (!s->keys[i].in_use && free_i < 0) {
            free_i = i;
        }
    }
    if (free_i < 0) {
        status = UCS_ERR_EXCEEDS_LIMIT;
    } else {
        kv_hmac_key_init(&s->keys[free_i], key_id, key, key_len);
    }
    pthread_mutex_unlock(&s->lock);
    return status;
}

static int kv_am_server_remove_key(kv_am_server_t *s, uint16_t key_id)
{
    int i, status = UCS_ERR_NO_ELEM;

    pthread_mutex_lock(&s->lock);
    for (i = 0; i < KV_CAP_MAX_KEYS; i++) {
        if (s->keys[i].in_use && s->keys[i].id == key_id) {
            memset(&s->keys[i], 0, sizeof(s->keys[i]));
            status = UCS_OK;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return status;
}

/* The master's clock as this node estimates it (its own wall clock + offset_ms), how far
 * behind that estimate may be (skew_ms), and the oldest term whose capabilities count. */
static void kv_am_server_set_policy(kv_am_server_t *s, int64_t offset_ms, uint64_t skew_ms,
                                    uint64_t min_term)
{
    pthread_mutex_lock(&s->lock);
    s->clock_offset_ms = offset_ms;
    s->skew_ms = skew_ms;
    s->min_term = min_term;
    pthread_mutex_unlock(&s->lock);
}

static int kv_am_server_add_segment(kv_am_server_t *s, const uint8_t *digest, void *base,
                                    uint64_t length, ucp_mem_h memh)
{
    int i, free_i = -1, status = UCS_OK;

    pthread_mutex_lock(&s->lock);
    for (i = 0; i < KV_AM_MAX_SEGMENTS; i++) {
        if (s->segments[i].state != KV_SEG_FREE && memcmp(s->segments[i].digest, digest, 16) == 0) {
            status = UCS_ERR_ALREADY_EXISTS;
            break;
        }
        if (s->segments[i].state == KV_SEG_FREE && free_i < 0) {
            free_i = i;
        }
    }
    if (status == UCS_OK && free_i < 0) {
        status = UCS_ERR_EXCEEDS_LIMIT;
    }
    if (status == UCS_OK) {
        kv_am_segment_t *seg = &s->segments[free_i];
        memcpy(seg->digest, digest, 16);
        seg->base = base;
        seg->length = length;
        seg->memh = memh;
        seg->inflight = 0;
        seg->state = KV_SEG_ACTIVE;
    }
    pthread_mutex_unlock(&s->lock);
    return status;
}

/* Stops serving a segment: no new transfer starts. Returns how many transfers into or out
 * of it are still in flight (0: its memory may go), or -1 when no such segment is served. */
static int kv_am_server_remove_segment(kv_am_server_t *s, const uint8_t *digest)
{
    int i, result = -1;

    pthread_mutex_lock(&s->lock);
    for (i = 0; i < KV_AM_MAX_SEGMENTS; i++) {
        kv_am_segment_t *seg = &s->segments[i];
        if (seg->state != KV_SEG_FREE && memcmp(seg->digest, digest, 16) == 0) {
            seg->state = seg->inflight == 0 ? KV_SEG_FREE : KV_SEG_DRAINING;
            result = (int)seg->inflight;
            break;
        }
    }
    pthread_mutex_unlock(&s->lock);
    return result;
}

static void kv_am_server_counters(kv_am_server_t *s, uint64_t *out, size_t n, uint32_t *inflight)
{
    size_t i;

    pthread_mutex_lock(&s->lock);
    for (i = 0; i < n && i < KV_AM_NCOUNTERS; i++) {
        out[i] = __atomic_load_n(&s->counters[i], __ATOMIC_RELAXED);
    }
    *inflight = s->inflight;
    pthread_mutex_unlock(&s->lock);
}

/* ---- the client end */

typedef struct {
    ucp_ep_h ep;
    void *local;
    size_t length;
    uint64_t offset;
    const uint8_t *cap;
    size_t cap_len;
    ucp_mem_h memh;
} kv_am_op_t;

typedef struct {
    void *send_req;
    int sent;
    int send_status;
    int rndv;
    int replied;
    int code;
    void *recv_req;
    int recv_status;
} kv_am_state_t;

typedef struct {
    ucp_worker_h worker;
    uint64_t next_id;
    /* the transfer in progress: replies for ids outside [base, base + n) are strays */
    uint64_t base;
    size_t n;
    int is_get;
    kv_am_op_t *ops;
    kv_am_state_t *st;
    uint64_t strays;
    int last_stray_code;
} kv_am_client_t;

/* The op a reply is for, or NULL (a stray: late, duplicate, or not ours). */
static kv_am_state_t *kv_am_client_match(kv_am_client_t *c, const void *header,
                                         size_t header_length, int is_get, int *code,
                                         size_t *index)
{
    const uint8_t *h = header;
    uint64_t id;

    *code = KV_AM_BAD_REPLY;
    if (header == NULL || header_length != KV_REPLY_LEN || kv_be32(h) != KV_REPLY_MAGIC) {
        c->strays++;
        c->last_stray_code = KV_AM_BAD_REPLY;
        return NULL;
    }
    *code = (int)kv_be32(h + 4);
    id = kv_be64(h + 8);
    if (c->n == 0 || c->is_get != is_get || id < c->base || id - c->base >= c->n ||
        c->st[id - c->base].replied) {
        c->strays++;
        c->last_stray_code = *code;
        return NULL;
    }
    *index = (size_t)(id - c->base);
    return &c->st[*index];
}

static ucs_status_t kv_am_client_put_reply(void *arg, const void *header, size_t header_length,
                                           void *data, size_t length,
                                           const ucp_am_recv_param_t *param)
{
    kv_am_client_t *c = arg;
    kv_am_state_t *st;
    size_t index;
    int code;

    (void)data;
    st = kv_am_client_match(c, header, header_length, 0, &code, &index);
    if (st != NULL) {
        st->replied = 1;
        st->code = length == 0 ? code : KV_AM_BAD_REPLY;
    }
    return (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) ? UCS_ERR_REJECTED : UCS_OK;
}

static ucs_status_t kv_am_client_get_data(void *arg, const void *header, size_t header_length,
                                          void *data, size_t length,
                                          const ucp_am_recv_param_t *param)
{
    kv_am_client_t *c = arg;
    int rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    ucp_request_param_t recv;
    kv_am_state_t *st;
    kv_am_op_t *op;
    size_t index;
    void *request;
    int code;

    st = kv_am_client_match(c, header, header_length, 1, &code, &index);
    if (st == NULL) {
        return UCS_OK; /* a stray rendezvous is dropped: the node's send completes */
    }
    op = &c->ops[index];
    st->replied = 1;
    st->code = code;
    if (code != KV_CAP_OK) {
        return UCS_OK;
    }
    if (length != op->length) {
        st->code = KV_AM_BAD_REPLY;
        return rndv ? UCS_ERR_REJECTED : UCS_OK;
    }
    if (!rndv) {
        memcpy(op->local, data, length);
        return UCS_OK;
    }
    memset(&recv, 0, sizeof(recv));
    if (op->memh != NULL) {
        recv.op_attr_mask = UCP_OP_ATTR_FIELD_MEMH;
        recv.memh = op->memh;
    }
    request = ucp_am_recv_data_nbx(c->worker, data, op->local, length, &recv);
    if (UCS_PTR_IS_ERR(request)) {
        st->recv_status = UCS_PTR_STATUS(request);
    } else {
        st->recv_req = request;
    }
    return UCS_INPROGRESS;
}

static int kv_am_client_create(ucp_worker_h worker, kv_am_client_t **out)
{
    kv_am_client_t *c = calloc(1, sizeof(*c));
    int status;

    if (c == NULL) {
        return UCS_ERR_NO_MEMORY;
    }
    c->worker = worker;
    c->next_id = 1;
    status = kv_am_set_handler(worker, KV_AM_ID_PUT_REPLY, kv_am_client_put_reply, c);
    if (status == UCS_OK) {
        status = kv_am_set_handler(worker, KV_AM_ID_GET_DATA, kv_am_client_get_data, c);
    }
    if (status != UCS_OK) {
        kv_am_set_handler(worker, KV_AM_ID_PUT_REPLY, NULL, NULL);
        free(c);
        return status;
    }
    *out = c;
    return UCS_OK;
}

static void kv_am_client_destroy(kv_am_client_t *c)
{
    kv_am_set_handler(c->worker, KV_AM_ID_PUT_REPLY, NULL, NULL);
    kv_am_set_handler(c->worker, KV_AM_ID_GET_DATA, NULL, NULL);
    free(c);
}

static void kv_am_client_strays(kv_am_client_t *c, uint64_t *count, int *last_code)
{
    *count = c->strays;
    *last_code = c->last_stray_code;
}

/* Polls an op's requests; returns 1 when nothing of it is in flight any more. */
static int kv_am_poll(kv_am_state_t *st)
{
    ucs_status_t status;

    if (st->send_req != NULL) {
        status = ucp_request_check_status(st->send_req);
        if (status != UCS_INPROGRESS) {
            ucp_request_free(st->send_req);
            st->send_req = NULL;
            st->sent = 1;
            st->send_status = status;
        }
    }
    if (st->recv_req != NULL) {
        status = ucp_request_check_status(st->recv_req);
        if (status != UCS_INPROGRESS) {
            ucp_request_free(st->recv_req);
            st->recv_req = NULL;
            st->recv_status = status;
        }
    }
    return st->send_req == NULL && st->recv_req == NULL;
}

/* Whether an op has its final outcome (and nothing of it is in flight). */
static int kv_am_finished(const kv_am_state_t *st, int is_get)
{
    (void)is_get;
    if (st->send_req != NULL || st->recv_req != NULL) {
        return 0;
    }
    if (st->send_status != UCS_OK && !(st->rndv && st->send_status == UCS_ERR_REJECTED)) {
        return 1; /* the request never reached the node */
    }
    /* a put's reply says its bytes are in the segment (or why not) */
    return st->replied;
}

static int kv_am_outcome(const kv_am_state_t *st, int is_get)
{
    if (st->send_status != UCS_OK && !(st->rndv && st->send_status == UCS_ERR_REJECTED)) {
        return st->send_status;
    }
    if (!st->replied) {
        return UCS_ERR_TIMED_OUT;
    }
    if (st->code != KV_CAP_OK) {
        return KV_AM_REFUSED + st->code;
    }
    if (st->send_status != UCS_OK) {
        return st->send_status;
    }
    return is_get ? st->recv_status : UCS_OK;
}

/*
 * Runs n checked transfers (all puts or all gets) to completion before the deadline.
 * Puts of rndv_thresh bytes and more go by rendezvous, smaller ones eagerly. status[i]
 * receives op i's outcome: UCS_OK, a UCX error, or KV_AM_REFUSED + the node's refusal code.
 * As with kv_transfer: when this returns, nothing touches the ops' buffers any more, or
 * *tainted is set (the worker must never be progressed again).
 */
static int kv_am_transfer(kv_am_client_t *c, int efd, int is_get, kv_am_op_t *ops, size_t n,
                          uint64_t rndv_thresh, double timeout, double grace, int *status,
                          int *tainted)
{
    uint8_t header[KV_REQ_LEN];
    ucp_request_param_t param;
    kv_am_state_t *st;
    double deadline = kv_now() + timeout;
    int armed = 0, result = UCS_OK;
    size_t i, left;
    void *request;

    *tainted = 0;
    if (n == 0) {
        return UCS_OK;
    }
    for (i = 0; i < n; i++) {
        if (ops[i].cap_len != KV_CAP_LEN || ops[i].length == 0) {
            return UCS_ERR_INVALID_PARAM;
        }
    }
    st = calloc(n, sizeof(*st));
    if (st == NULL) {
        return UCS_ERR_NO_MEMORY;
    }
    c->base = c->next_id;
    c->next_id += n;
    c->n = n;
    c->is_get = is_get;
    c->ops = ops;
    c->st = st;
    for (i = 0; i < n; i++) {
        kv_put_be32(header, KV_REQ_MAGIC);
        header[4] = is_get ? KV_OP_GET : KV_OP_PUT;
        header[5] = header[6] = header[7] = 0;
        kv_put_be64(header + 8, c->base + i);
        kv_put_be64(header + 16, ops[i].offset);
        kv_put_be64(header + 24, ops[i].length);
        memcpy(header + 32, ops[i].cap, KV_CAP_LEN);
        memset(&param, 0, sizeof(param));
        param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_COPY_HEADER;
        if (is_get) {
            param.flags |= UCP_AM_SEND_FLAG_EAGER;
            request = ucp_am_send_nbx(ops[i].ep, KV_AM_ID_GET, header, sizeof(header), NULL, 0,
                                      &param);
        } else {
            st[i].rndv = ops[i].length >= rndv_thresh;
            param.flags |= st[i].rndv ? UCP_AM_SEND_FLAG_RNDV : UCP_AM_SEND_FLAG_EAGER;
            if (ops[i].memh != NULL) {
                param.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
                param.memh = ops[i].memh;
            }
            request = ucp_am_send_nbx(ops[i].ep, KV_AM_ID_PUT, header, sizeof(header),
                                      ops[i].local, ops[i].length, &param);
        }
        if (request == NULL) {
            st[i].sent = 1;
        } else if (UCS_PTR_IS_ERR(request)) {
            st[i].sent = 1;
            st[i].send_status = UCS_PTR_STATUS(request);
        } else {
            st[i].send_req = request;
        }
    }
    for (;;) {
        left = 0;
        for (i = 0; i < n; i++) {
            kv_am_poll(&st[i]);
            left += !kv_am_finished(&st[i], is_get);
        }
        if (left == 0 || kv_now() >= deadline) {
            break;
        }
        kv_wait_step(c->worker, efd, deadline, 0.05, &armed);
    }
    /* From here on, replies for these ids are strays: no buffer of this call is written
     * after it returns. What is already in flight is drained, for at most `grace`. */
    c->n = 0;
    if (left != 0) {
        deadline = kv_now() + grace;
        armed = 0;
        for (;;) {
            left = 0;
            for (i = 0; i < n; i++) {
                left += !kv_am_poll(&st[i]);
            }
            if (left == 0 || kv_now() >= deadline) {
                break;
            }
            kv_wait_step(c->worker, efd, deadline, 0.05, &armed);
        }
    }
    for (i = 0; i < n; i++) {
        if (st[i].send_req != NULL || st[i].recv_req != NULL) {
            if (st[i].send_req != NULL) {
                ucp_request_free(st[i].send_req);
            }
            if (st[i].recv_req != NULL) {
                ucp_request_free(st[i].recv_req);
            }
            *tainted = 1;
            status[i] = UCS_ERR_TIMED_OUT;
        } else if (!kv_am_finished(&st[i], is_get)) {
            status[i] = UCS_ERR_TIMED_OUT;
        } else {
            status[i] = kv_am_outcome(&st[i], is_get);
        }
        if (status[i] != UCS_OK && result == UCS_OK) {
            result = status[i];
        }
    }
    c->ops = NULL;
    c->st = NULL;
    free(st);
    return result;
}

/* For tests: sends one active message as given (any id, header, flags) and waits for its
 * local completion until the timeout. */
static int kv_am_send_raw(ucp_worker_h worker, int efd, ucp_ep_h ep, unsigned id,
                          const void *header, size_t header_length, const void *data,
                          size_t length, uint32_t flags, double timeout)
{
    ucp_request_param_t param;

    memset(&param, 0, sizeof(param));
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = flags | UCP_AM_SEND_FLAG_COPY_HEADER;
    return kv_wait_request(worker, efd,
                           ucp_am_send_nbx(ep, id, header, header_length, data, length, &param),
                           kv_now() + timeout);
}

/* The largest active-message header this worker can send. */
static int kv_worker_max_am_header(ucp_worker_h worker, size_t *out)
{
    ucp_worker_attr_t attr;
    ucs_status_t status;

    memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_WORKER_ATTR_FIELD_MAX_AM_HEADER;
    status = ucp_worker_query(worker, &attr);
    *out = attr.max_am_header;
    return status;
}
