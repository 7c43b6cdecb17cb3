/* An instant stand-in for the CUDA driver's five VMM calls, as a C library (for CPU tests and
 * the CPU overhead bench of the C fast path; workbench/gpu/cfakedriver.py wraps it for Python).
 *
 * Same ABI as the driver's cuMemCreate/cuMemMap/cuMemSetAccess/cuMemUnmap/cuMemRelease and the
 * same rules as workbench/gpu/fakedriver.py: allocations against a capacity, a map must cover a
 * whole allocation, a map onto a mapped start is refused, an unmap takes one mapping or a run of
 * adjacent ones covering the range exactly. Every call is logged (op, va, size, handle, info),
 * and the k-th call since fake_reset can be made to fail with a given status, doing nothing.
 * One state per loaded library.
 */
#include <stdint.h>
#include <string.h>

typedef int CUresult;
typedef uint64_t u64;
enum { OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_SUPPORTED = 801 };
enum { OP_CREATE = 1, OP_MAP, OP_ACCESS, OP_UNMAP, OP_RELEASE };

/* the driver's structs, as far as they are read here */
typedef struct { int type; int id; } location_t;
typedef struct {
    int type;
    int requested_handle_types;
    location_t location;
    void *win32_meta;
    unsigned char flags[8];
} prop_t;
typedef struct { location_t location; int flags; } desc_t;

#define MAX_ALLOCS 8192
#define MAX_MAPS 16384
#define MAX_LOG 200000

static struct { u64 handle, size; } allocs[MAX_ALLOCS];
static struct { u64 va, size; } maps[MAX_MAPS];
static u64 calllog[MAX_LOG][5];
static int n_allocs, n_maps;
static u64 capacity, used, next_handle = 1, n_calls, fail_at, n_logged;
static CUresult fail_code;

void fake_reset(u64 cap) {
    n_allocs = n_maps = 0;
    used = n_calls = fail_at = n_logged = 0;
    next_handle = 1;
    capacity = cap;
}

/* the k-th call from now on (1-based) returns ``code`` and does nothing; 0: none */
void fake_fail(u64 k, int code) {
    fail_at = k ? n_calls + k : 0;
    fail_code = code;
}

u64 fake_calls(void) { return n_calls; }
u64 fake_used(void) { return used; }
int fake_mappings(void) { return n_maps; }
int fake_allocations(void) { return n_allocs; }

/* copy up to ``max`` log entries of 5 words each; returns how many were logged in all */
u64 fake_log(u64 *out, u64 max) {
    u64 n = n_logged < max ? n_logged : max;
    if (n)
        memcpy(out, calllog, n * sizeof calllog[0]);
    return n_logged;
}

/* log the call; nonzero when it is the one to fail */
static int enter(u64 op, u64 va, u64 size, u64 handle, u64 info) {
    n_calls++;
    if (n_logged < MAX_LOG) {
        u64 *e = calllog[n_logged++];
        e[0] = op | (n_calls == fail_at ? 1u << 8 : 0);
        e[1] = va;
        e[2] = size;
        e[3] = handle;
        e[4] = info;
    }
    return n_calls == fail_at;
}

static int find_alloc(u64 handle) {
    for (int i = 0; i < n_allocs; i++)
        if (allocs[i].handle == handle)
            return i;
    return -1;
}

static int find_map(u64 va) {
    for (int i = 0; i < n_maps; i++)
        if (maps[i].va == va)
            return i;
    return -1;
}

CUresult cuMemCreate(u64 *handle, size_t size, const prop_t *prop, unsigned long long flags) {
    u64 info = (u64)prop->type | (u64)prop->location.type << 8 | (u64)prop->location.id << 16;
    if (enter(OP_CREATE, 0, size, 0, info | flags << 32))
        return fail_code;
    if (used + size > capacity || n_allocs == MAX_ALLOCS)
        return OUT_OF_MEMORY;
    allocs[n_allocs].handle = *handle = next_handle++;
    allocs[n_allocs++].size = size;
    used += size;
    return OK;
}

CUresult cuMemMap(u64 va, size_t size, size_t offset, u64 handle, unsigned long long flags) {
    if (enter(OP_MAP, va, size, handle, offset | flags << 32))
        return fail_code;
    int a = find_alloc(handle);
    if (a < 0 || allocs[a].size != size || offset)
        return NOT_SUPPORTED; /* only whole allocations map */
    if (find_map(va) >= 0 || n_maps == MAX_MAPS)
        return INVALID_VALUE;
    maps[n_maps].va = va;
    maps[n_maps++].size = size;
    return OK;
}

CUresult cuMemSetAccess(u64 va, size_t size, const desc_t *desc, size_t count) {
    u64 info = (u64)desc->flags | (u64)desc->location.type << 8 | (u64)desc->location.id << 16;
    if (enter(OP_ACCESS, va, size, count, info))
        return fail_code;
    return OK;
}

static void drop_map(int i) { maps[i] = maps[--n_maps]; }

CUresult cuMemUnmap(u64 va, size_t size) {
    if (enter(OP_UNMAP, va, size, 0, 0))
        return fail_code;
    int i = find_map(va);
    if (i >= 0 && maps[i].size == size) {
        drop_map(i);
        return OK;
    }
    u64 pos = va; /* a run of adjacent mappings covering [va, va+size) exactly */
    while (pos < va + size && (i = find_map(pos)) >= 0)
        pos += maps[i].size;
    if (pos != va + size)
        return INVALID_VALUE;
    for (pos = va; pos < va + size;) {
        i = find_map(pos);
        pos += maps[i].size;
        drop_map(i);
    }
    return OK;
}

CUresult cuMemRelease(u64 handle) {
    if (enter(OP_RELEASE, 0, 0, handle, 0))
        return fail_code;
    int a = find_alloc(handle);
    if (a < 0)
        return INVALID_VALUE;
    used -= allocs[a].size;
    allocs[a] = allocs[--n_allocs];
    return OK;
}
