// CPU kernel of ELMo's stacked projected biLSTM (op `bilstm`; oracle: elmo_fast.bilm.reference.bilstm_ref).
//
// The whole stack runs here, no Python in the time loop (argument checks and the plan: lstm_args.h and
// lstm_plan.h, shared with the CUDA op):
//   * Rows are sorted by length (descending) once, so the rows still running at step s are the
//     prefix [0, n_s). The backward direction walks each row from its own last token (step s of
//     sorted row j is position len_j - 1 - s), which gives it the same prefixes; it stays in that
//     reversed order through all layers and is put back in place only when outputs are written.
//   * Per (layer, direction), the step-s rows are stored packed at [off_s, off_s + n_s) (as a
//     PackedSequence): nothing is computed for padding, and a layer's input gates for all steps
//     are one GEMM over the packed rows.
//   * Per step: recurrent GEMM h[:n_s] W_hh^T -> one fused pass (input gates, gate
//     nonlinearities, cell update and clip, o * tanh(c)) -> projection GEMM -> a pass for the
//     projection clip, the skip connection and the packed output. The recurrent and projection
//     GEMMs of steps with few rows (the tuning's threshold, tuning.h) run in gemv_nt (lstm_gemv.h),
//     the others and the input GEMMs in ATen (BLAS / oneDNN).
//   * float32 weights may be packed (pack_weight): every GEMM of the float path is then oneDNN's BRGeMM
//     micro-kernel on the weights as packed once at load (packed_gemm.h), instead of gemv_nt or BLAS.
//   * Weights in bfloat16 (states, gates, outputs float32), two ways, chosen by the weights given:
//     - packed (pack_weight): every GEMM is oneDNN's BRGeMM micro-kernel (packed_gemm.h; AMX or
//       AVX512-BF16) on the weights as packed once at load, with bf16 inputs written by the
//       pointwise passes themselves (hc by the cell pass, h by the projection pass) and a float
//       result the next pass reads;
//     - plain [N, K]: gemv_nt steps widen the weights and keep the activations in fp32; other GEMMs
//       are oneDNN's matmul (at::mm in bf16), which reorders the weights on every call: inputs
//       rounded to bf16, fp32 accumulation, a bf16 result that the pointwise passes widen.
//     Which is faster depends on the CPU: the calibration measures both (elmo_fast/bilm/calibration.py).
//   * The forward and backward stacks never read each other, so with >= 2 threads they can run
//     concurrently, one per thread, each with single-threaded GEMMs (BLAS runs one thread inside a
//     parallel region), or in turn with multi-threaded GEMMs: the tuning says which (tuning.h).
//   * Every buffer is allocated once per call.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>
#include <c10/util/irange.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

#include "checks.h"
#include "cpu/lstm_common.h"
#include "cpu/lstm_pointwise.h"
#include "cpu/packed_gemm.h"
#include "cpu/tuning.h"
#include "lstm_args.h"
#include "packed_weight.h"

namespace elmo_fast {
namespace {

using namespace lstm_cpu;  // Weight, linear_nt, the tuning: shared with lstm_layer_cpu.cpp

// The float cell passes: <states, input gates, recurrent gates, hc>, bf16 as raw bits.
using CellF32 = lstm::CellParams<float>;
using CellBf16Rec = lstm::CellParams<float, float, uint16_t, uint16_t>;  // layer 0, oneDNN step
using CellBf16 = lstm::CellParams<float, uint16_t, uint16_t, uint16_t>;  // layers >= 1, oneDNN step
using CellBf16Gates = lstm::CellParams<float, uint16_t, float, float>;   // layers >= 1, gemv_nt step
using CellPacked = lstm::CellParams<float, float, float, uint16_t>;      // packed weights
using ProjF32 = lstm::ProjParams<float>;
using ProjBf16 = lstm::ProjParams<float, uint16_t>;
ELMO_FAST_ISA_DISPATCHED(cell_rows_f32, CellF32, lstm::cell_rows)
ELMO_FAST_ISA_DISPATCHED(cell_rows_bf16_rec, CellBf16Rec, lstm::cell_rows)
ELMO_FAST_ISA_DISPATCHED(cell_rows_bf16, CellBf16, lstm::cell_rows)
ELMO_FAST_ISA_DISPATCHED(cell_rows_bf16_gates, CellBf16Gates, lstm::cell_rows)
ELMO_FAST_ISA_DISPATCHED(cell_rows_packed, CellPacked, lstm::cell_rows)
ELMO_FAST_ISA_DISPATCHED(proj_elems_f32, ProjF32, lstm::proj_elems)
ELMO_FAST_ISA_DISPATCHED(proj_elems_bf16, ProjBf16, lstm::proj_elems)

void cell_rows_any(const CellF32& p, int64_t b, int64_t e) { cell_rows_f32(p, b, e); }
void cell_rows_any(const CellBf16Rec& p, int64_t b, int64_t e) { cell_rows_bf16_rec(p, b, e); }
void cell_rows_any(const CellBf16& p, int64_t b, int64_t e) { cell_rows_bf16(p, b, e); }
void cell_rows_any(const CellBf16Gates& p, int64_t b, int64_t e) { cell_rows_bf16_gates(p, b, e); }
void cell_rows_any(const CellPacked& p, int64_t b, int64_t e) { cell_rows_packed(p, b, e); }
void cell_rows_any(const lstm::CellParams<double>& p, int64_t b, int64_t e) { lstm::cell_rows(p, b, e); }
void proj_elems_any(const ProjF32& p, int64_t b, int64_t e) { proj_elems_f32(p, b, e); }
void proj_elems_any(const ProjBf16& p, int64_t b, int64_t e) { proj_elems_bf16(p, b, e); }
void proj_elems_any(const lstm::ProjParams<double>& p, int64_t b, int64_t e) { lstm::proj_elems(p, b, e); }

// Everything one call reads.
template <typename scalar_t>
struct Problem {
  const LstmPlan* plan;
  int64_t layers, proj, cell;              // L, P, C
  const scalar_t* xg0;                     // [U, 2, 4C], rows 4C contiguous
  const int64_t* xg0_offset;               // [2, packed rows]: element offset of each packed row's gates
  std::vector<Weight> w_ih, w_hh, w_proj;  // [2L]: [4C, P], [4C, P], [P, C] (w_ih undefined for l = 0)
  std::vector<at::Tensor> bias;            // [2L]: [4C] in scalar_t (undefined for l = 0)
  const scalar_t* zeros;                   // [4C] the bias of gates that already hold theirs
  int64_t gemv_max_rows;                   // GEMMs of at most this many rows use gemv_nt
  bool packed16;                           // the GEMM weights are packed bf16 (float states)
  const scalar_t* h0;                      // [L, B, 2P] contiguous, or nullptr (zeros)
  const scalar_t* c0;                      // [L, B, 2C] contiguous, or nullptr (zeros)
  scalar_t cell_clip, proj_clip;           // +inf: none
  scalar_t* out;                           // [L, B, T, 2P]
  scalar_t* h_out;                         // [L, B, 2P]
  scalar_t* c_out;                         // [L, B, 2C]
};

// One direction's buffers, allocated once per call and reused by every layer and step.
struct Workspace {
  at::Tensor x;      // [packed rows, P] the layer's output (its input before; the skip adds in place)
  at::Tensor gates;  // [packed rows, 4C] input gates x W_ih^T + bias of layers >= 1 (L > 1, not bf16)
  at::Tensor rec;    // [n_0, 4C] recurrent gates of one step
  at::Tensor hc;     // [n_0, C] sig(o) * tanh(c) of one step
  at::Tensor h;      // [B, P] state, sorted rows; rows past n_s keep their final value
  at::Tensor c;      // [B, C] state, likewise
  // bfloat16 weights only: the GEMM operands and results of the oneDNN path, flat so that any
  // [rows, cols] prefix view is contiguous.
  at::Tensor in16;     // [n_0 * max(P, C)] a GEMM's input rounded to bf16
  at::Tensor out16;    // [n_0 * 4C] a GEMM's bf16 result
  at::Tensor x16;      // [packed rows, P] the layer input rounded to bf16 (L > 1)
  at::Tensor gates16;  // [packed rows, 4C] x W_ih^T in bf16, without the bias (L > 1, plain weights)
  at::Tensor h16;      // [B, P] h rounded to bf16 (packed weights): the recurrent GEMM's input
};

// uint16_t view of a bf16 tensor's data, for the kernels (which know bf16 as raw bits).
uint16_t* bf16_bits(const at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.mutable_data_ptr<at::BFloat16>()); }

template <typename scalar_t>
void run_direction(const Problem<scalar_t>& pb, Workspace& ws, int64_t d) {
  const LstmPlan& sc = *pb.plan;
  const int64_t B = sc.batch, T = sc.time, P = pb.proj, C = pb.cell, L = pb.layers;
  const int64_t S = sc.steps();
  scalar_t* x = ws.x.mutable_data_ptr<scalar_t>();
  scalar_t* h = ws.h.mutable_data_ptr<scalar_t>();
  scalar_t* c = ws.c.mutable_data_ptr<scalar_t>();
  for (const auto l : c10::irange(L)) {
    const int64_t ld = 2 * l + d;
    // Initial state of every row (rows of length 0 keep it).
    for (const auto j : c10::irange(B)) {
      const int64_t b = sc.order[j];
      if (pb.h0 != nullptr) {
        std::memcpy(h + j * P, pb.h0 + (l * B + b) * 2 * P + d * P, P * sizeof(scalar_t));
      } else {
        std::fill_n(h + j * P, P, scalar_t(0));
      }
      if (pb.c0 != nullptr) {
        std::memcpy(c + j * C, pb.c0 + (l * B + b) * 2 * C + d * C, C * sizeof(scalar_t));
      } else {
        std::fill_n(c + j * C, C, scalar_t(0));
      }
    }
    if (pb.packed16) {
      ws.h16.copy_(ws.h);  // the first step's GEMM input; the projection pass writes the next ones
    }
    if (l > 0 && S > 0) {
      if (pb.packed16) {
        ws.x16.copy_(ws.x);
        // float gates without the bias (the cell pass adds it)
        cpu_gemm::packed_mm("bilstm", ws.gates.mutable_data_ptr<float>(), 4 * C, ws.x16.const_data_ptr<at::BFloat16>(),
                            P, sc.total(), pb.w_ih[ld].w);
      } else if (pb.w_ih[ld].w.scalar_type() == at::kBFloat16) {
        ws.x16.copy_(ws.x);
        at::mm_out(ws.gates16, ws.x16, pb.w_ih[ld].w_t);  // the cell pass adds the fp32 bias
      } else if (ws.x.scalar_type() == at::kFloat &&
                 (sc.total() <= pb.gemv_max_rows || is_packed_weight(pb.w_ih[ld].w))) {
        // Few rows (short batches): one pass over W_ih in gemv_nt, as the steps' GEMMs (W_ih has
        // W_hh's shape: the same threshold); or float32 packed weights, at any row count.
        linear_nt(ws.gates, ws.x, pb.w_ih[ld], sc.total());
        ws.gates.add_(pb.bias[ld]);
      } else {
        at::addmm_out(ws.gates, pb.bias[ld], ws.x, pb.w_ih[ld].w_t);
      }
    }
    for (const auto s : c10::irange(S)) {
      const int64_t n = sc.running[s];
      const int64_t off = sc.offset[s];
      // Input gates: layer 0's from xg0; later layers' from the packed GEMM result (bf16 weights:
      // without the bias; plain ones: in bf16).
      const bool gates16 = l > 0 && ws.gates16.defined();
      const scalar_t* xg = l == 0 ? pb.xg0 : gates16 ? nullptr : ws.gates.const_data_ptr<scalar_t>() + off * 4 * C;
      const uint16_t* xg16 = gates16 ? bf16_bits(ws.gates16) + off * 4 * C : nullptr;
      const int64_t* xg_offset = l == 0 ? pb.xg0_offset + d * sc.total() + off : nullptr;
      const bool add_bias = gates16 || (pb.packed16 && l > 0);
      const scalar_t* bias = add_bias ? pb.bias[ld].template const_data_ptr<scalar_t>() : pb.zeros;
      const auto cell = [&](auto cp, auto rec, auto hc) {
        if constexpr (std::is_same_v<decltype(cp.xg), const uint16_t*>) {
          cp.xg = xg16;
        } else {
          cp.xg = xg;
        }
        cp.xg_offset = xg_offset;
        cp.bias = bias;
        cp.rec = rec;
        cp.c = c;
        cp.hc = hc;
        cp.cell = C;
        cp.cell_clip = pb.cell_clip;
        at::parallel_for(0, n, std::max<int64_t>(1, kCellGrainElements / C),
                         [&](int64_t b0, int64_t b1) { cell_rows_any(cp, b0, b1); });
      };
      const auto proj = [&](auto pp, auto in) {
        pp.in = in;
        pp.h = h;
        pp.x = x + off * P;
        pp.numel = n * P;
        pp.skip = l > 0;
        pp.proj_clip = pb.proj_clip;
        at::parallel_for(0, pp.numel, kElemGrain, [&](int64_t e0, int64_t e1) { proj_elems_any(pp, e0, e1); });
      };
      at::Tensor h_active = ws.h.narrow(0, 0, n);
      bool done = false;
      if constexpr (std::is_same_v<scalar_t, float>) {
        if (pb.packed16) {
          // BRGeMM on the packed weights: bf16 in (h16, hc16), float out.
          at::Tensor rec = ws.rec.narrow(0, 0, n);
          cpu_gemm::packed_mm("bilstm", rec.mutable_data_ptr<float>(), 4 * C, ws.h16.const_data_ptr<at::BFloat16>(), P,
                              n, pb.w_hh[ld].w);
          uint16_t* hc16 = bf16_bits(ws.in16);  // [n, C]
          cell(CellPacked{}, rec.const_data_ptr<float>(), hc16);
          cpu_gemm::packed_mm("bilstm", h, P, reinterpret_cast<const at::BFloat16*>(hc16), C, n, pb.w_proj[ld].w);
          lstm::ProjParams<float> pp;
          pp.h16 = bf16_bits(ws.h16);
          proj(pp, static_cast<const float*>(h));  // in place
          done = true;
        } else if (pb.w_hh[ld].w.scalar_type() == at::kBFloat16 && n > pb.gemv_max_rows) {
          // oneDNN's bf16 GEMMs, with bf16 in and out; the pointwise passes convert on the fly.
          at::Tensor h16 = front(ws.in16, n, P);
          at::Tensor rec16 = front(ws.out16, n, 4 * C);
          h16.copy_(h_active);
          at::mm_out(rec16, h16, pb.w_hh[ld].w_t);
          at::Tensor hc16 = front(ws.in16, n, C);  // h16 is consumed
          if (gates16) {
            cell(CellBf16{}, bf16_bits(rec16), bf16_bits(hc16));
          } else {
            cell(CellBf16Rec{}, bf16_bits(rec16), bf16_bits(hc16));
          }
          at::Tensor proj16 = front(ws.out16, n, P);  // rec16 is consumed
          at::mm_out(proj16, hc16, pb.w_proj[ld].w_t);
          proj(ProjBf16{}, bf16_bits(proj16));
          done = true;
        }
      }
      if (!done) {
        at::Tensor rec = ws.rec.narrow(0, 0, n);
        linear_nt(rec, h_active, pb.w_hh[ld], pb.gemv_max_rows);
        const scalar_t* rec_p = rec.const_data_ptr<scalar_t>();
        scalar_t* hc_p = ws.hc.mutable_data_ptr<scalar_t>();
        bool celled = false;
        if constexpr (std::is_same_v<scalar_t, float>) {
          if (gates16) {
            cell(CellBf16Gates{}, rec_p, hc_p);
            celled = true;
          }
        }
        if (!celled) {
          cell(lstm::CellParams<scalar_t>{}, rec_p, hc_p);
        }
        linear_nt(h_active, ws.hc.narrow(0, 0, n), pb.w_proj[ld], pb.gemv_max_rows);
        proj(lstm::ProjParams<scalar_t>{}, static_cast<const scalar_t*>(h));  // in place
      }
    }

    // Outputs of this layer and direction, back in input order and time order; zero at padding.
    scalar_t* out = pb.out + l * B * T * 2 * P + d * P;
    at::parallel_for(0, B, std::max<int64_t>(1, kElemGrain / std::max<int64_t>(T * P, 1)), [&](int64_t b0, int64_t b1) {
      for (const auto b : c10::irange(b0, b1)) {
        const int64_t j = sc.rank[b];
        const int64_t len = sc.length[j];
        for (const auto t : c10::irange(T)) {
          scalar_t* dst = out + (b * T + t) * 2 * P;
          if (t < len) {
            const int64_t s = d == 0 ? t : len - 1 - t;
            std::memcpy(dst, x + (sc.offset[s] + j) * P, P * sizeof(scalar_t));
          } else {
            std::fill_n(dst, P, scalar_t(0));
          }
        }
      }
    });
    for (const auto b : c10::irange(B)) {
      const int64_t j = sc.rank[b];
      std::memcpy(pb.h_out + (l * B + b) * 2 * P + d * P, h + j * P, P * sizeof(scalar_t));
      std::memcpy(pb.c_out + (l * B + b) * 2 * C + d * C, c + j * C, C * sizeof(scalar_t));
    }
  }
}

template <typename scalar_t>
void run_bilstm(const Problem<scalar_t>& pb, Workspace* ws, bool concurrent_directions) {
  for_each_direction(concurrent_directions, [&](int64_t d) { run_direction(pb, ws[d], d); });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> bilstm_cpu(
    const at::Tensor& xg0, const at::Tensor& token_index, const at::Tensor& lengths, at::TensorList weights,
    std::optional<double> cell_clip, std::optional<double> proj_clip, const std::optional<at::Tensor>& h0_opt,
    const std::optional<at::Tensor>& c0_opt, std::optional<at::IntArrayRef> tuning_opt) {
  static constexpr char kOp[] = "bilstm";
  const BilstmDims dims = bilstm_dims(xg0, token_index, weights);
  const int64_t L = dims.L, P = dims.P, C = dims.C, U = dims.U, B = dims.B, T = dims.T;
  ELMO_CHECK_CPU(xg0);
  const at::ScalarType dtype = xg0.scalar_type();
  ELMO_CHECK(dtype == at::kFloat || dtype == at::kDouble, "xg0 has dtype ", dtype_name(dtype),
             "; supported: float32, float64");
  // The GEMM weights share one dtype: xg0's, or bfloat16 with float32 states.
  const at::ScalarType wdtype = weights[1].scalar_type();
  ELMO_CHECK(wdtype == dtype || (dtype == at::kFloat && wdtype == at::kBFloat16), "weights[1] (w_hh of ",
             "layer 0, forward) has dtype ", dtype_name(wdtype), "; with xg0 of dtype ", dtype_name(dtype),
             " the weights must be ", dtype_name(dtype), dtype == at::kFloat ? " or bfloat16" : "");
  check_bilstm_args(dims, xg0, token_index, lengths, weights, wdtype, cell_clip, proj_clip, h0_opt, c0_opt,
                    /*packed_ok=*/wdtype == at::kBFloat16 || wdtype == at::kFloat);
  // Packed weights (bf16 only): all the GEMM weights the op reads, or none.
  int64_t gemm_weights = 0, packed_weights = 0;
  for (const auto ld : c10::irange(2 * L)) {
    for (const int64_t k : {0, 1, 3}) {
      if (ld >= 2 || k != 0) {  // layer 0's w_ih is not read
        ++gemm_weights;
        packed_weights += is_packed_weight(weights[4 * ld + k]) ? 1 : 0;
      }
    }
  }
  ELMO_CHECK(packed_weights == 0 || packed_weights == gemm_weights, "the GEMM weights (w_hh, w_proj, and w_ih of ",
             "layers >= 1) must be all packed or none, got ", packed_weights, " of ", gemm_weights, " packed");
  // bf16 packed weights take the step of their own (h and hc rounded to bf16 by the passes); float32
  // packed ones the float step, through linear_nt.
  const bool packed = packed_weights > 0 && wdtype == at::kBFloat16;
  ELMO_CHECK(!packed || cpu_gemm::packed_gemm_available(at::kBFloat16),
             "bfloat16 weights packed for oneDNN's BRGeMM micro-kernel cannot run now (torch.backends.mkldnn is "
             "disabled, or this CPU lacks AVX-512 with BF16 or AMX): pass weights that are not packed");
  const LstmTuning tuning = lstm_tuning(kOp, tuning_opt, wdtype == at::kBFloat16, 4 * C * P * int64_t{sizeof(float)});
  const at::Tensor lengths_c = bilstm_host_lengths(dims, lengths);
  const at::Tensor index_c = token_index.contiguous();
  const int64_t* len_p = lengths_c.const_data_ptr<int64_t>();
  const int64_t* idx_p = index_c.const_data_ptr<int64_t>();
  check_token_rows(kOp, idx_p, len_p, B, T, U, "xg0");

  // Gates rows must be contiguous; any other layout of xg0's last dim is copied once.
  const at::Tensor xg0_c = (xg0.size(2) <= 1 || xg0.stride(2) == 1) ? xg0 : xg0.contiguous();
  const LstmPlan plan = make_lstm_plan(len_p, B, T);
  const int64_t N = plan.total();
  const int64_t n0 = plan.first_running();
  const bool concurrent = directions_concurrent(tuning, n0);

  // Layer 0 reads its gates from xg0 in place: the element offset of each packed row, per direction.
  std::vector<int64_t> xg0_offset(2 * N);
  for (const auto d : c10::irange(2)) {
    plan.for_each_position(d, [&](int64_t r, int64_t, int64_t b, int64_t t) {
      xg0_offset[d * N + r] = idx_p[b * T + t] * xg0_c.stride(0) + d * xg0_c.stride(1);
    });
  }

  const auto opts = xg0.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor out = at::empty({L, B, T, 2 * P}, opts);
  at::Tensor h_out = at::empty({L, B, 2 * P}, opts);
  at::Tensor c_out = at::empty({L, B, 2 * C}, opts);
  const at::Tensor h0_c = h0_opt.has_value() ? h0_opt->contiguous() : at::Tensor();
  const at::Tensor c0_c = c0_opt.has_value() ? c0_opt->contiguous() : at::Tensor();

  const at::Tensor zeros = at::zeros({4 * C}, opts);
  Workspace ws[2];
  for (auto& w : ws) {
    w.x = at::empty({N, P}, opts);
    if (L > 1 && (wdtype != at::kBFloat16 || packed)) {
      w.gates = at::empty({N, 4 * C}, opts);
    }
    w.rec = at::empty({n0, 4 * C}, opts);
    if (!packed) {
      w.hc = at::empty({n0, C}, opts);
    }
    w.h = at::empty({B, P}, opts);
    w.c = at::empty({B, C}, opts);
    if (wdtype == at::kBFloat16) {
      const auto opts16 = opts.dtype(at::kBFloat16);
      w.in16 = at::empty({n0 * std::max(P, C)}, opts16);
      if (packed) {
        w.h16 = at::empty({B, P}, opts16);
      } else {
        w.out16 = at::empty({n0 * 4 * C}, opts16);
      }
      if (L > 1) {
        w.x16 = at::empty({N, P}, opts16);
        if (!packed) {
          w.gates16 = at::empty({N, 4 * C}, opts16);
        }
      }
    }
  }

  AT_DISPATCH_FLOATING_TYPES(dtype, "bilstm", [&] {
    Problem<scalar_t> pb;
    pb.plan = &plan;
    pb.layers = L;
    pb.proj = P;
    pb.cell = C;
    pb.xg0 = xg0_c.const_data_ptr<scalar_t>();
    pb.xg0_offset = xg0_offset.data();
    const auto weight = [](const at::Tensor& t) {
      at::Tensor w = t.contiguous();
      return is_packed_weight(w) ? Weight{w, at::Tensor()} : Weight{w, w.t()};
    };
    for (const auto ld : c10::irange(2 * L)) {
      const bool first = ld < 2;
      pb.w_ih.push_back(first ? Weight{} : weight(weights[4 * ld]));
      pb.w_hh.push_back(weight(weights[4 * ld + 1]));
      pb.bias.push_back(first ? at::Tensor() : weights[4 * ld + 2].to(dtype).contiguous());
      pb.w_proj.push_back(weight(weights[4 * ld + 3]));
    }
    pb.gemv_max_rows = gemv_rows(tuning, concurrent);
    pb.packed16 = packed;
    pb.zeros = zeros.const_data_ptr<scalar_t>();
    pb.h0 = h0_c.defined() ? h0_c.const_data_ptr<scalar_t>() : nullptr;
    pb.c0 = c0_c.defined() ? c0_c.const_data_ptr<scalar_t>() : nullptr;
    pb.cell_clip = static_cast<scalar_t>(clip_bound(cell_clip));
    pb.proj_clip = static_cast<scalar_t>(clip_bound(proj_clip));
    pb.out = out.mutable_data_ptr<scalar_t>();
    pb.h_out = h_out.mutable_data_ptr<scalar_t>();
    pb.c_out = c_out.mutable_data_ptr<scalar_t>();
    run_bilstm(pb, ws, concurrent);
  });
  return {out, h_out, c_out};
}

}  // namespace
}  // namespace elmo_fast

TORCH_LIBRARY_IMPL(elmo_fast, CPU, m) { m.impl("bilstm", &elmo_fast::bilstm_cpu); }
