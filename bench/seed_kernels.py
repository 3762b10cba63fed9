"""The tutorial's grouped GEMM kernels under Triton JIT (an anchor, used only
when triton is importable): its basic kernel with masks added so that any shape
is correct, and its TMA kernel, with the tutorial's autotune configs and its
host code (metadata built with torch.tensor on every call)."""
import torch
import triton
import triton.language as tl


def _num_sms():
    return torch.cuda.get_device_properties(0).multi_processor_count


def _configs():
    return [triton.Config({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 32, "NUM_SM": 84}),
            triton.Config({"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "NUM_SM": 128}),
            triton.Config({"BLOCK_SIZE_M": 128, "BLOCK_SIZE_N": 128, "BLOCK_SIZE_K": 64,
                           "NUM_SM": _num_sms()})]


@triton.autotune(configs=_configs(), key=["group_size"])
@triton.jit
def seed_basic_kernel(group_a_ptrs, group_b_ptrs, group_c_ptrs, group_gemm_sizes, g_lds, group_size,
                      NUM_SM: tl.constexpr, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
                      BLOCK_SIZE_K: tl.constexpr):
    tile_idx = tl.program_id(0)
    last_problem_end = 0
    for g in range(group_size):
        gm = tl.load(group_gemm_sizes + g * 3)
        gn = tl.load(group_gemm_sizes + g * 3 + 1)
        gk = tl.load(group_gemm_sizes + g * 3 + 2)
        num_m_tiles = tl.cdiv(gm, BLOCK_SIZE_M)
        num_n_tiles = tl.cdiv(gn, BLOCK_SIZE_N)
        num_tiles = num_m_tiles * num_n_tiles
        while tile_idx >= last_problem_end and tile_idx < last_problem_end + num_tiles:
            lda = tl.load(g_lds + g * 3)
            ldb = tl.load(g_lds + g * 3 + 1)
            ldc = tl.load(g_lds + g * 3 + 2)
            a_ptr = tl.load(group_a_ptrs + g).to(tl.pointer_type(tl.float16))
            b_ptr = tl.load(group_b_ptrs + g).to(tl.pointer_type(tl.float16))
            c_ptr = tl.load(group_c_ptrs + g).to(tl.pointer_type(tl.float16))
            tile_in_gemm = tile_idx - last_problem_end
            tile_m = tile_in_gemm // num_n_tiles
            tile_n = tile_in_gemm % num_n_tiles
            offs_m = tile_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
            offs_n = tile_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
            offs_k = tl.arange(0, BLOCK_SIZE_K)
            a_ptrs = a_ptr + offs_m[:, None] * lda + offs_k[None, :]
            b_ptrs = b_ptr + offs_k[:, None] * ldb + offs_n[None, :]
            acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
            for kk in range(0, tl.cdiv(gk, BLOCK_SIZE_K)):
                k_left = gk - kk * BLOCK_SIZE_K
                a = tl.load(a_ptrs, mask=(offs_m[:, None] < gm) & (offs_k[None, :] < k_left), other=0.0)
                b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & (offs_n[None, :] < gn), other=0.0)
                acc += tl.dot(a, b)
                a_ptrs += BLOCK_SIZE_K
                b_ptrs += BLOCK_SIZE_K * ldb
            c_ptrs = c_ptr + ldc * offs_m[:, None] + offs_n[None, :]
            tl.store(c_ptrs, acc.to(tl.float16), mask=(offs_m[:, None] < gm) & (offs_n[None, :] < gn))
            tile_idx += NUM_SM
        last_problem_end = last_problem_end + num_tiles


def seed_grouped_gemm(As, Bs):
    """The tutorial's host function: builds five metadata tensors on every call."""
    device = As[0].device
    a_addrs, b_addrs, c_addrs, sizes, lds, Cs = [], [], [], [], [], []
    for a, b in zip(As, Bs):
        m, k = a.shape
        n = b.shape[1]
        c = torch.empty((m, n), device=device, dtype=a.dtype)
        Cs.append(c)
        a_addrs.append(a.data_ptr())
        b_addrs.append(b.data_ptr())
        c_addrs.append(c.data_ptr())
        sizes += [m, n, k]
        lds += [a.stride(0), b.stride(0), c.stride(0)]
    d_a = torch.tensor(a_addrs, device=device)
    d_b = torch.tensor(b_addrs, device=device)
    d_c = torch.tensor(c_addrs, device=device)
    d_sizes = torch.tensor(sizes, dtype=torch.int32, device=device)
    d_lds = torch.tensor(lds, dtype=torch.int32, device=device)
    seed_basic_kernel[lambda meta: (meta["NUM_SM"],)](d_a, d_b, d_c, d_sizes, d_lds, len(As))
    return Cs
