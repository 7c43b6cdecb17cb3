/* The driver calls of one page id in one C call, for workbench/gpu/fastcalls.py.
 *
 * CudaDevice's batched calls issue create+map+set_access per target on a grow and unmap+release
 * on a shrink. From Python each driver call costs its binding's argument and result handling,
 * and on a slow host the Python between the calls runs cold after every call. Here the calls of
 * one batch run back to back; Python checks the refusals before and updates its tables after.
 *
 * Built without CUDA headers or toolkit: the driver is opened at run time (dlopen) and the five
 * prototypes below are the driver API's own (CUdeviceptr and the allocation handle are 64-bit).
 * The allocation prop and access descriptors are the caller's structs, passed by address.
 *
 * One job buffer of 64-bit words carries a call's inputs and outputs (layout: fastcalls.py):
 * header words, then 4 words per target, then (unmap+release) the handles.
 */
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef int CUresult;
typedef uint64_t u64;
typedef CUresult (*create_fn)(u64 *handle, size_t size, const void *prop, unsigned long long fl);
typedef CUresult (*map_fn)(u64 va, size_t size, size_t offset, u64 handle, unsigned long long fl);
typedef CUresult (*access_fn)(u64 va, size_t size, const void *desc, size_t count);
typedef CUresult (*unmap_fn)(u64 va, size_t size);
typedef CUresult (*release_fn)(u64 handle);

typedef struct {
    void *lib;
    create_fn create;
    map_fn map;
    access_fn access;
    unmap_fn unmap;
    release_fn release;
} wb_driver;

/* header words of a job */
enum { J_DRIVER, J_PROP, J_RW, J_ZDESC, J_N, J_M, J_STAGE, J_CODE, J_DONE, J_RELEASED, J_HEAD = 16 };
/* the call that failed (J_STAGE) */
enum { S_OK, S_CREATE, S_ZERO_UNMAP, S_MAP, S_ACCESS, S_UNMAP, S_RELEASE };
/* per-target words: va, size, in (map: unmap a zero piece first; unmap: zero handle, 0 none),
 * out (map: the handle created; unmap: 1 when the zero piece went back) */
enum { T_VA, T_SIZE, T_IN, T_OUT, T_WORDS };

/* Open the driver library at ``path`` and find the five calls; NULL (and ``err`` says why). */
wb_driver *wb_open(const char *path, char *err, size_t errlen) {
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(err, errlen, "%s", dlerror());
        return NULL;
    }
    wb_driver *d = calloc(1, sizeof *d);
    if (!d) {
        dlclose(lib);
        snprintf(err, errlen, "out of host memory");
        return NULL;
    }
    static const char *names[] = {"cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap",
                                  "cuMemRelease"};
    void *fns[5];
    for (int i = 0; i < 5; i++) {
        fns[i] = dlsym(lib, names[i]);
        if (!fns[i]) {
            snprintf(err, errlen, "%s has no %s", path, names[i]);
            dlclose(lib);
            free(d);
            return NULL;
        }
    }
    d->lib = lib;
    d->create = (create_fn)fns[0];
    d->map = (map_fn)fns[1];
    d->access = (access_fn)fns[2];
    d->unmap = (unmap_fn)fns[3];
    d->release = (release_fn)fns[4];
    return d;
}

void wb_close(wb_driver *d) {
    if (d) {
        dlclose(d->lib);
        free(d);
    }
}

static int failed(u64 *job, u64 stage, CUresult code, u64 done) {
    job[J_STAGE] = stage;
    job[J_CODE] = (u64)(unsigned)code;
    job[J_DONE] = done;
    return 1;
}

/* For each target in order: create, unmap its zero piece (when asked), map, set access.
 * Stops at the first failure: J_DONE targets were mapped with access (the failing one's handle,
 * when its create succeeded, is in its T_OUT). Returns 0 when every target is done. */
int wb_map(u64 *job) {
    const wb_driver *d = (const wb_driver *)(uintptr_t)job[J_DRIVER];
    const void *prop = (const void *)(uintptr_t)job[J_PROP];
    const void *rw = (const void *)(uintptr_t)job[J_RW];
    u64 n = job[J_N];
    u64 *t = job + J_HEAD;
    for (u64 i = 0; i < n; i++, t += T_WORDS) {
        u64 h = 0;
        CUresult r = d->create(&h, (size_t)t[T_SIZE], prop, 0);
        if (r)
            return failed(job, S_CREATE, r, i);
        t[T_OUT] = h;
        if (t[T_IN] && (r = d->unmap(t[T_VA], (size_t)t[T_SIZE])))
            return failed(job, S_ZERO_UNMAP, r, i);
        if ((r = d->map(t[T_VA], (size_t)t[T_SIZE], 0, h, 0)))
            return failed(job, S_MAP, r, i);
        if ((r = d->access(t[T_VA], (size_t)t[T_SIZE], rw, 1)))
            return failed(job, S_ACCESS, r, i + 1);
    }
    job[J_STAGE] = S_OK;
    job[J_DONE] = n;
    return 0;
}

/* The zero piece back on targets [0, n): map the target's zero handle read-only (J_ZDESC), a
 * failure leaving a hole (T_OUT 0) and nothing mapped. */
static void put_zeros(const wb_driver *d, u64 *job, u64 n) {
    const void *zdesc = (const void *)(uintptr_t)job[J_ZDESC];
    u64 *t = job + J_HEAD;
    for (u64 i = 0; i < n; i++, t += T_WORDS) {
        t[T_OUT] = 0;
        if (!t[T_IN] || d->map(t[T_VA], (size_t)t[T_SIZE], 0, t[T_IN], 0))
            continue;
        if (d->access(t[T_VA], (size_t)t[T_SIZE], zdesc, 1)) {
            d->unmap(t[T_VA], (size_t)t[T_SIZE]);
            continue;
        }
        t[T_OUT] = 1;
    }
}

/* Unmap every target, release every handle, then put the zero pieces back: the bare calls'
 * order. An unmap failure stops there (J_DONE unmapped, nothing released, zeros back on those);
 * a release failure stops the releases (J_RELEASED) and the zeros still go back on every target.
 * Returns 0 when every call succeeded. */
int wb_unmap_release(u64 *job) {
    const wb_driver *d = (const wb_driver *)(uintptr_t)job[J_DRIVER];
    u64 n = job[J_N], m = job[J_M];
    u64 *t = job + J_HEAD;
    const u64 *handles = job + J_HEAD + T_WORDS * n;
    CUresult r;
    job[J_RELEASED] = 0;
    for (u64 i = 0; i < n; i++, t += T_WORDS) {
        if ((r = d->unmap(t[T_VA], (size_t)t[T_SIZE]))) {
            put_zeros(d, job, i);
            return failed(job, S_UNMAP, r, i);
        }
    }
    job[J_DONE] = n;
    job[J_STAGE] = S_OK;
    for (u64 j = 0; j < m; j++) {
        if ((r = d->release(handles[j]))) {
            job[J_STAGE] = S_RELEASE;
            job[J_CODE] = (u64)(unsigned)r;
            break;
        }
        job[J_RELEASED] = j + 1;
    }
    put_zeros(d, job, n);
    return job[J_STAGE] != S_OK;
}
