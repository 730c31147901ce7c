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
