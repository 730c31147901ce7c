"""cffi builder for ``kvpool.transport._ucp_cffi``, our binding to libucp.

Compiled at install time (``setup.py`` lists it in ``cffi_modules``) against the headers and
libraries of the ``libucx-cu12`` wheel. The C side lives in ``ucp_helpers.c``; this file
declares what Python may call.
"""

from __future__ import annotations

import os
from pathlib import Path

from cffi import FFI

CDEF = """
typedef struct ucp_context *ucp_context_h;
typedef struct ucp_worker *ucp_worker_h;
typedef struct ucp_ep *ucp_ep_h;
typedef struct ucp_rkey *ucp_rkey_h;
typedef struct ucp_mem *ucp_mem_h;

typedef struct {
    ucp_ep_h ep;
    ucp_rkey_h rkey;
    void *local;
    uint64_t remote;
    size_t length;
    ucp_mem_h memh;
} kv_op_t;

typedef struct {
    int level;
    unsigned line;
    unsigned repeats;
    char file[...];
    char text[...];
} kv_log_entry_t;

#define UCS_OK ...
#define UCS_INPROGRESS ...
#define UCS_ERR_TIMED_OUT ...
#define UCS_ERR_UNREACHABLE ...
#define UCS_ERR_CANCELED ...

const char *kv_status_string(int status);
int kv_context_create(ucp_context_h *out, const char **keys, const char **values, size_t n);
void kv_context_destroy(ucp_context_h context);
int kv_worker_create(ucp_context_h context, ucp_worker_h *out, int *efd);
void kv_worker_destroy(ucp_worker_h worker);
int kv_worker_address(ucp_worker_h worker, void **buf, size_t *len);
void kv_worker_address_release(ucp_worker_h worker, void *buf);
int kv_ep_create(ucp_worker_h worker, const void *address, int peer_errors, ucp_ep_h *out);
int kv_ep_uses_transport(ucp_ep_h ep, const char *name);
int kv_ep_close(ucp_worker_h worker, int efd, ucp_ep_h ep, double timeout);
int kv_mem_map(ucp_context_h context, void *address, size_t length, ucp_mem_h *out);
int kv_mem_unmap(ucp_context_h context, ucp_mem_h memh);
int kv_rkey_pack(ucp_context_h context, ucp_mem_h memh, void **buf, size_t *len);
void kv_rkey_buffer_release(void *buf);
int kv_rkey_unpack(ucp_ep_h ep, const void *buf, ucp_rkey_h *out);
void kv_rkey_destroy(ucp_rkey_h rkey);
int kv_transfer(ucp_worker_h worker, int efd, int is_get, kv_op_t *ops, size_t n,
                double timeout, double grace, int *status, ucp_ep_h *closed,
                size_t *n_closed, int *tainted);
int kv_progress_loop(ucp_worker_h worker, int efd, int stop_fd);
unsigned kv_worker_progress(ucp_worker_h worker);
void kv_log_install(int notify_fd, int also_ucx);
size_t kv_log_take(kv_log_entry_t *out, size_t max, uint64_t *dropped);
void kv_log_emit(int level, unsigned line, const char *text);

/* checked data path: capabilities and active messages (ucp_helpers.c, second half) */
typedef struct kv_am_server kv_am_server_t;
typedef struct kv_am_client kv_am_client_t;

typedef struct {
    ucp_ep_h ep;
    void *local;
    size_t length;
    uint64_t offset;
    const uint8_t *cap;
    size_t cap_len;
    ucp_mem_h memh;
} kv_am_op_t;

#define KV_FEATURE_RMA ...
#define KV_FEATURE_AM ...
#define KV_CAP_LEN ...
#define KV_REQ_LEN ...
#define KV_REPLY_LEN ...
#define KV_REQ_MAGIC ...
#define KV_REPLY_MAGIC ...
#define KV_AM_ID_PUT ...
#define KV_AM_ID_GET ...
#define KV_AM_ID_PUT_REPLY ...
#define KV_AM_ID_GET_DATA ...
#define KV_AM_REFUSED ...
#define KV_AM_NCODES ...
#define KV_AM_NCOUNTERS ...
#define KV_CNT_PUTS ...
#define KV_CNT_GETS ...
#define KV_CNT_PUT_BYTES ...
#define KV_CNT_GET_BYTES ...
#define KV_CNT_NO_REPLY_EP ...
#define KV_CNT_COMPLETION_ERRORS ...
#define KV_CNT_REPLIES_DROPPED ...
#define UCS_ERR_REJECTED ...

int kv_context_create_features(ucp_context_h *out, const char **keys, const char **values,
                               size_t n, int features);
void kv_hmac_sha256(const uint8_t *key, size_t key_len, const uint8_t *msg, size_t n,
                    uint8_t *out);
int kv_cap_check(const uint8_t *cap, size_t cap_len, const uint16_t *key_ids,
                 const uint8_t *keys, size_t n_keys, uint64_t min_term, uint64_t now_ms,
                 uint64_t skew_ms, const uint8_t *digest, uint64_t offset, uint64_t length,
                 int rights);
int kv_am_server_create(ucp_worker_h worker, uint32_t max_inflight, uint64_t rndv_thresh,
                        kv_am_server_t **out);
uint32_t kv_am_server_destroy(kv_am_server_t *s);
int kv_am_server_set_key(kv_am_server_t *s, uint16_t key_id, const uint8_t *key,
                         size_t key_len);
int kv_am_server_remove_key(kv_am_server_t *s, uint16_t key_id);
void kv_am_server_set_policy(kv_am_server_t *s, int64_t offset_ms, uint64_t skew_ms,
                             uint64_t min_term);
int kv_am_server_add_segment(kv_am_server_t *s, const uint8_t *digest, void *base,
                             uint64_t length, ucp_mem_h memh);
int kv_am_server_remove_segment(kv_am_server_t *s, const uint8_t *digest);
void kv_am_server_counters(kv_am_server_t *s, uint64_t *out, size_t n, uint32_t *inflight);
int kv_am_client_create(ucp_worker_h worker, kv_am_client_t **out);
void kv_am_client_destroy(kv_am_client_t *c);
void kv_am_client_strays(kv_am_client_t *c, uint64_t *count, int *last_code);
int kv_am_transfer(kv_am_client_t *c, int efd, int is_get, kv_am_op_t *ops, size_t n,
                   uint64_t rndv_thresh, double timeout, double grace, int *status,
                   int *tainted);
int kv_am_send_raw(ucp_worker_h worker, int efd, ucp_ep_h ep, unsigned id, const void *header,
                   size_t header_length, const void *data, size_t length, uint32_t flags,
                   double timeout);
int kv_worker_max_am_header(ucp_worker_h worker, size_t *out);
"""


def _libucx_root() -> Path:
    import libucx

    return Path(libucx.__file__).parent


def make_builder() -> FFI:
    root = _libucx_root()
    here = Path(__file__).parent
    builder = FFI()
    builder.cdef(CDEF)
    builder.set_source(
        "kvpool.transport._ucp_cffi",
        (here / "ucp_helpers.c").read_text(),
        include_dirs=[str(root / "include")],
        library_dirs=[str(root / "lib")],
        libraries=["ucp", "ucs"],
        extra_compile_args=["-O2", "-Wall", "-Wno-unused-function"],
    )
    return builder


ffibuilder = make_builder()

if __name__ == "__main__":
    ffibuilder.compile(tmpdir=os.environ.get("KVPOOL_BUILD_DIR", "."), verbose=True)
