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
