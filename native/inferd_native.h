/* Native kernels for inferd's CPU backend. Portable C99 that GCC/Clang vectorise on x86-64 and aarch64.
   This file is parsed by cffi's cdef: plain declarations only (no macros, no includes).
   Tensors are float32, row-major, one image (C, H, W) at a time unless stated. */
int inferd_native_abi(void);

/* On a fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) write the thread, the faulting address and the native
   frames to stderr, then run the handler that was there before (crash.c). Returns how many signals it took (the same
   on a second call: it installs once). */
int inferd_install_crash_report(void);
int inferd_crash_report_fd(int fd);

/* col[(c*kh + i)*kw + j][oh*OW + ow] = x[c][oh*sh - pt + i*dh][ow*sw - pl + j*dw], 0 outside the image. */
void inferd_im2col(const float* x, int C, int H, int W, int kh, int kw, int sh, int sw, int dh, int dw,
                   int pt, int pl, int OH, int OW, float* col);

/* Adjoint of im2col: y[c][oh*sh - pt + i*dh][ow*sw - pl + j*dw] += col[(c*kh + i)*kw + j][oh*OW + ow].
   y has shape (C, H, W) and is accumulated into (not cleared); (OH, OW) is the spatial size of col. */
void inferd_col2im(const float* col, int C, int H, int W, int kh, int kw, int sh, int sw, int dh, int dw,
                   int pt, int pl, int OH, int OW, float* y);
/* inferd_col2im, each output plane first set to bias[c] (or zero where bias is NULL) when init is set. */
void inferd_col2im_ex(const float* col, int C, int H, int W, int kh, int kw, int sh, int sw, int dh, int dw,
                      int pt, int pl, int OH, int OW, float* y, const float* bias, int init);

/* Depthwise conv of C input channels with channel multiplier mult: output channel c*mult + k reads input channel c.
   w: (C*mult, kh, kw); bias: (C*mult) or NULL; y: (C*mult, OH, OW), overwritten with act(conv + bias)
   (act codes as in inferd_bias_act). Returns 0, or -1 if out of memory. */
int inferd_dwconv2d(const float* x, const float* w, const float* bias, float* y, int C, int mult,
                    int H, int W, int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl, int OH, int OW,
                    int act, float p0, float p1);

/* Depthwise conv straight from NCHW rows (dwconv.c): channel multiplier 1, k x k kernel (k = 3 or 5), stride s
   (1 or 2) both ways, dilation 1; w (C, k, k), bias (C) or NULL, y (C, OH, OW) = act(conv + bias).
   _applies says whether a geometry is one it takes; _inplace whether it reads the rows in place (stride 1,
   "same" columns, W >= 8 + pl) rather than through padded row copies. Returns 0, -1 if out of memory, -2 for
   a geometry it does not take. */
int inferd_dwconv2d_direct_applies(int mult, int kh, int kw, int sh, int sw, int dh, int dw);
int inferd_dwconv2d_direct_inplace(int k, int s, int pl, int W, int OW);
int inferd_dwconv2d_direct(const float* x, const float* w, const float* bias, float* y, int C, int H, int W, int k, int s,
                           int pt, int pl, int OH, int OW, int act, float p0, float p1);

/* Winograd F(m x m, r x r) input transform, alpha = m + r - 1, BT: (alpha, alpha) row-major.
   Tile (ti, tj) covers input rows ti*m - pt .. + alpha and columns tj*m - pl .. + alpha (0 outside).
   Writes V[(a*alpha + b)*ldpos + c*ldc + p0 + ti*tW + tj] for channels c in [0, C). Returns 0, or -1 if out of memory. */
int inferd_winograd_input(const float* x, int C, int H, int W, int pt, int pl, int tH, int tW, int m, int alpha,
                           const float* BT, float* V, long long ldpos, long long ldc, long long p0);

/* Winograd output transform: y[co][ti*m + i][tj*m + j] = bias[co] + (AT M AT^T)[i][j] for the tile (ti, tj),
   where M[a][b] = Mw[(a*alpha + b)*ldpos + co*ldc + p0 + ti*tW + tj]; cropped to (OH, OW). bias may be NULL.
   Returns 0, or -1 if out of memory. */
int inferd_winograd_output(const float* Mw, int Cout, int OH, int OW, int tH, int tW, int m, int alpha,
                            const float* AT, const float* bias, float* y, long long ldpos, long long ldc, long long p0);
/* The same, then per channel (Cout, OH, OW contiguous) the residual res (same layout, or NULL) and the activation
   (the codes of inferd_bias_act) while the plane is still in cache. */
int inferd_winograd_output_ex(const float* Mw, int Cout, int OH, int OW, int tH, int tW, int m, int alpha,
                              const float* AT, const float* bias, float* y, long long ldpos, long long ldc,
                              long long p0, const float* res, int act, float ap0, float ap1);

/* In-place epilogue over C rows of HW floats: y[c*ldy + k] = act(y[c*ldy + k] + bias[c] + res[c*ldr + k]).
   bias/res may be NULL. act: 0 none, 1 Relu, 2 Clip(p0, p1), 3 LeakyRelu(alpha = p0), 4 Sigmoid, 5 SiLU,
   6 HardSwish, 7 HardSigmoid(alpha = p0, beta = p1). */
void inferd_bias_act(float* y, long long ldy, const float* bias, const float* res, long long ldr, int C, long long HW,
                     int act, float p0, float p1);
/* y[r, :] = x[r, :] * s[r] for rows of `inner` floats, split over the pool (y may be x). */
void inferd_scale_rows(const float* x, const float* s, float* y, long long rows, long long inner);

/* y[k] = erf(x[k]) for k < n, max abs error ~1e-7; y may be x (in place) but must not partially overlap it.
   erf(+-inf) = +-1, NaN propagates. */
void inferd_erf(const float* x, float* y, long long n);

/* In place GELU over n floats: approx 0 -> 0.5 y (1 + erf(y / sqrt 2)), approx 1 -> the tanh approximation
   0.5 y (1 + tanh(sqrt(2/pi) (y + 0.044715 y^3))). GELU(-inf) = -0, GELU(inf) = inf, NaN propagates. */
void inferd_gelu(float* y, long long n, int approx);

/* ---- banded im2col + GEMM convolution (convtile.c), group 1, one image ----
   y (M, OH, OW) = act(W x + bias + res), W packed by inferd_gemm_pack_a (M x C*kh*kw); res (M, OH, OW) or NULL.
   Each task builds the columns of `band` output rows (inferd_conv_tiled_band: the rows that fill ~256 KB) in one
   of `slots` slices of col (inferd_conv_tiled_workspace floats; one slice per pool thread: a task that finds
   none free allocates its own) and multiplies them on one thread. Returns 0, or -1 if out of memory. */
int inferd_conv_tiled_band(int C, int kh, int kw, int OH, int OW);
long long inferd_conv_tiled_workspace(int C, int kh, int kw, int OW, int band, int slots);
int inferd_conv_tiled(const float* x, int C, int H, int W, int kh, int kw, int sh, int sw, int dh, int dw, int pt,
                      int pl, int OH, int OW, const float* ap, int M, const float* bias, const float* res, float* y,
                      int act, float p0, float p1, float* col, int band, int slots);

/* ---- direct convolution, group 1 (convdirect.c): the GEMM micro-kernel over the padded / phase-split input ----
   y (M, OH, OW) = act(W x + bias + res) for one image x (C, H, W), top/left padding pt/pl (bottom and right
   follow from OH, OW). W packed by inferd_gemm_pack_a as the (M, C*kh*kw) matrix; ws a workspace of
   inferd_conv_direct_workspace floats, 8-byte aligned: the row offsets and `slots` band buffers (each task copies
   the input planes of a band of output rows into a free one; one per pool thread: a task that finds none free
   allocates its own). applies: kh*kw <= 49, strides 1-4, any dilation, pads >= 0 (pb, pr unused but checked).
   Returns 0, -1 if out of memory, or -2 where it does not apply. */
int inferd_conv_direct_applies(int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl, int pb, int pr);
long long inferd_conv_direct_workspace(int C, int H, int W, int kh, int kw, int sh, int sw, int dh, int dw, int pt,
                                       int pl, int OH, int OW, int slots);
int inferd_conv_direct(const float* x, int C, int H, int W, int kh, int kw, int sh, int sw, int dh, int dw, int pt,
                       int pl, int OH, int OW, const float* ap, int M, const float* bias, const float* res, float* y,
                       int act, float p0, float p1, float* ws, int slots);

/* ---- thread pool (pool.c): the caller works too; tasks are claimed dynamically ---- */
/* Threads used by inferd_parallel, the caller included (1 = run everything inline). */
void inferd_pool_set_threads(int n);
int inferd_pool_threads(void);
/* How long idle workers spin before they sleep (microseconds). */
void inferd_pool_set_spin_us(int us);
/* Moves the calling thread off core `cpu` if it runs there (to another core of its affinity, which is then
   restored); the core it runs on afterwards (-1 where unknown). A worker calls it with its caller's core. */
int inferd_pool_leave_core(int cpu);
/* Jobs worker i (0-based, the caller not counted) has entered so far; whether it sleeps now (-1: no such worker).
   A job wakes and enters only the workers it takes. */
long long inferd_pool_worker_jobs(int i);
int inferd_pool_worker_asleep(int i);
/* At most n threads (0: no cap) for the jobs the calling thread submits from now on; the cap in force. */
void inferd_pool_set_caller_cap(int n);
int inferd_pool_caller_cap(void);
/* Run fn(ctx, t) for t in [0, ntasks) on up to max_threads threads (0 = all); returns when all are done.
   A call made while the pool is busy (another thread, or from inside a task) runs inline. */
void inferd_parallel(void (*fn)(void* ctx, long long task), void* ctx, long long ntasks, int max_threads);

/* ---- packed GEMM (gemm.c) ---- */
/* Floats of a packed A (M x K): panels of 8 rows, k-major. */
long long inferd_gemm_packed_size(int M, int K);
/* Pack A, element (m, k) at a[m*lda_m + k*lda_k], into ap (inferd_gemm_packed_size floats). */
void inferd_gemm_pack_a(const float* a, long long lda_m, long long lda_k, int M, int K, float* ap);
/* The micro-kernel in use: 0 baseline (SSE2/NEON), 1 AVX2+FMA, 2 AVX-512. set_isa(-1) picks the best the CPU
   has; a level the CPU lacks gives the best it has. Returns the level now in use. */
int inferd_gemm_set_isa(int level);
int inferd_gemm_isa(void);
/* For each batch item q < batch: C = act(A B + bias + R), A (M x K) packed at ap + q*ap_bs, B element (k, n) at
   b[q*b_bs + k*bsk + n*bsn], C element (m, n) at c[q*c_bs + m*csm + n*csn], R (same strides as C, or NULL) at
   r + q*r_bs, bias (M, or NULL) at bias + q*bias_bs. act codes as in inferd_bias_act. C must not overlap A, B.
   Runs on up to max_threads pool threads (0 = all). Returns 0, or -1 if out of memory. */
int inferd_gemm(const float* ap, long long ap_bs, int M, int K, int N, int batch, const float* b, long long bsk,
                long long bsn, long long b_bs, float* c, long long csm, long long csn, long long c_bs,
                const float* bias, long long bias_bs, const float* r, long long r_bs, int act, float p0, float p1,
                int max_threads);
/* Output maps up to this many pixels use the channel-blocked depthwise form (tuning and tests). */
void inferd_dw_blocked_max_pixels(int n);
/* Floats of a prepacked B (K x N): panels of 96 columns, k-major, columns past N zero. */
long long inferd_gemm_packed_b_size(int K, int N);
/* Pack B, element (k, n) at b[k*bsk + n*bsn], into bp (inferd_gemm_packed_b_size floats). */
void inferd_gemm_pack_b(const float* b, long long bsk, long long bsn, int K, int N, float* bp);
/* The general form: A either packed (a_packed = 1, inferd_gemm_pack_a; asm/ask unused) or a strided matrix
   (element (m, k) at a[m*asm + k*ask]); B either strided or prepacked (b_packed = 1, inferd_gemm_pack_b;
   bsk/bsn unused); bias one per row (bias_cols = 0) or per column (1). Batch strides a_bs and b_bs count
   floats of whichever form is given. */
int inferd_gemm_ex(int M, int K, int N, int batch, const float* a, long long asm_, long long ask, long long a_bs,
                   int a_packed, const float* b, long long bsk, long long bsn, long long b_bs, int b_packed, float* c,
                   long long csm, long long csn, long long c_bs, const float* bias, long long bias_bs, int bias_cols,
                   const float* r, long long r_bs, int act, float p0, float p1, int max_threads);
/* C = act(A B + bias + R), A packed (inferd_gemm_pack_a), B's element (k, n) at b[boff[k] + coff[n]] (an implicit
   im2col: a convolution's column matrix read from the input, never stored), bias one per row, C and R rows at
   pitch csm with contiguous columns. -1 when an offset table is NULL or out of memory. */
int inferd_gemm_koff(const float* ap, int M, int K, int N, const float* b, const long long* boff,
                     const long long* coff, float* c, long long csm, const float* bias, const float* r, int act,
                     float p0, float p1, int max_threads);

/* ---- row-wise kernels (rows.c), over the last (contiguous) axis of rows x n floats; y may be x ---- */
/* Softmax (log_ = 0) or LogSoftmax (log_ = 1) of each row. */
void inferd_softmax(const float* x, float* y, long long rows, long long n, int log_);
/* (x - mean) / sqrt(var + eps) * g + b per row (population variance); g and b (n floats) may be NULL. */
void inferd_layernorm(const float* x, float* y, long long rows, long long n, const float* g, const float* b, float eps);

/* x / sqrt(mean(x^2) + eps) * g per row (RMSNormalization); g (n floats) may be NULL. */
void inferd_rmsnorm(const float* x, float* y, long long rows, long long n, const float* g, float eps);
/* x / max(sqrt(sum(x^2)), eps) per row (torch's F.normalize: ReduceL2, Clip and Div as exported). */
void inferd_l2norm(const float* x, float* y, long long rows, long long n, float eps);
/* GroupNormalization of N x C x hw floats (C divisible by G): per (image, group) mean and population variance,
   then per channel (x - mean) / sqrt(var + eps) * s[c] + b[c]. */
void inferd_groupnorm(const float* x, float* y, long long N, long long C, long long hw, int G, const float* s,
                      const float* b, float eps);

/* ---- data movement (copy.c, gather.c) ---- */
/* dst (C-contiguous) = the view of src with `shape` and byte `strides` (any signs), elements of `itemsize` bytes
   (copy.c); -1 for more than 8 non-unit axes after merging or a bad argument. */
int inferd_strided_copy(void* dst, const void* src, int ndim, const long long* shape, const long long* strides,
                        int itemsize);
/* CumSum of outer x n x inner floats along the middle axis (y must not overlap x). */
void inferd_cumsum(const float* x, float* y, long long outer, long long n, long long inner, int exclusive,
                   int reverse);
/* DepthToSpace of N x (C*bs*bs) x H x W elements of elem_size bytes into N x C x H*bs x W*bs (crd: CRD mode). */
void inferd_depth_to_space(const void* x, void* y, long long N, long long C, long long H, long long W, long long bs,
                           int crd, long long elem_size);
/* GatherND: for each of `batch` batches (data advancing batch_bytes) and each of its `tuples` index tuples of q
   int64 (negative from the end) into dims[0..q), copy the slice of slice_bytes to out, in order. Returns -1, or
   the flat number of the first tuple out of range (nothing after it is written). */
long long inferd_gather_nd(const void* data, const long long* dims, int q, long long batch, long long batch_bytes,
                           const long long* idx, long long tuples, long long slice_bytes, void* out);
/* ScatterND: out = data (`total` floats, copied over the pool; data NULL or out: out already holds it), then each
   tuple's slice of `slice` floats replaced (reduction 0) or combined (1 add, 2 mul, 3 max, 4 min) with its
   update, in order. Returns -1 or the first bad tuple (the slices before it are written). */
long long inferd_scatter_nd(float* out, const float* data, long long total, const long long* dims, int q,
                            const long long* idx, long long tuples, const float* updates, long long slice,
                            int reduction);

/* ---- GridSample (sampling.c) ---- */
/* 2-D GridSample of x (N, C, H, W) at grid (N, P, 2) (x, y in [-1, 1]) into y (N, C, P): nearest (1) or bilinear,
   pad 0 zeros, 1 border, 2 reflection, onnxruntime's rules. Returns 0, -1 if out of memory, -2 for an image
   too large for 32-bit offsets. */
int inferd_grid_sample(const float* x, long long N, long long C, long long H, long long W, const float* grid,
                       long long P, float* y, int nearest, int pad, int align);

/* ---- Resize (resize.c) ---- */
/* Nearest upsampling of `planes` (H, W) planes by integer factors: y (planes, H*fh, W*fw), y[.., h, w] =
   x[.., h / fh, w / fw]; elements of esize bytes (1, 2, 4 or 8). Returns 0, or -2 for bad arguments. */
int inferd_upsample_nearest(const void* x, void* y, long long planes, int H, int W, int fh, int fw, int esize);
/* Linear resize of `planes` (H, W) float planes into (OH, OW): output row i blends input rows ylo[i], yhi[i] with
   weights wylo[i], wyhi[i], then column j blends columns xlo[j], xhi[j] with wxlo[j], wxhi[j]. 0, or -2 for bad
   arguments (an index outside the plane). */
int inferd_resize_linear2d(const float* x, float* y, long long planes, int H, int W, int OH, int OW, const int* ylo,
                           const int* yhi, const float* wylo, const float* wyhi, const int* xlo, const int* xhi,
                           const float* wxlo, const float* wxhi);

/* ---- pooling (pooling.c) ---- */
/* Max (is_max = 1) or average pooling of `planes` (H, W) planes into (OH, OW): output (oh, ow) combines input
   (oh*sh - pt + i*dh, ow*sw - pl + j*dw) over the taps inside the image; averages are multiplied by
   inv_count[oh*OW + ow] (the caller's count rule), unused for max. Max propagates NaN. Returns 0, or -1 if
   out of memory. */
int inferd_pool2d(const float* x, float* y, int planes, int H, int W, int kh, int kw, int sh, int sw, int dh, int dw,
                   int pt, int pl, int OH, int OW, int is_max, const float* inv_count);
/* y[r] = mean (is_max = 0) or max (is_max = 1, NaN propagates) of row r of rows x n floats: global pooling. */
void inferd_reduce_rows(const float* x, float* y, long long rows, long long n, int is_max);
/* FLOP/s of `threads` pool threads running independent FMA chains for `iters` iterations each, in the widest
   vectors the CPU has: the measured peak that roofline tables divide by. */
double inferd_fma_peak(long long iters, int threads);

/* ---- recurrent steps (rnn.c) ---- */
/* One direction of an RNN (kind 0, 1 gate), GRU (1: z, r, h) or LSTM (2: i, o, f, c) over `seq` steps.
   xw: the input projections, G*H floats for step t of item b at xw + t*xw_ts + b*xw_bs (W's bias and R's bias
   of every gate but GRU's h gate included). rt: R^T (H x G*H, row-major). rb: G*H floats of which only GRU's
   h gate part is read. peep: LSTM peepholes (i, o, f; 3H) or NULL. lens: per item steps (NULL: all seq);
   reverse walks each item from its own last step. h, c: (batch, H) initial states in, final out (c: LSTM).
   y: step t of item b written at y + t*y_ts + b*y_bs (H floats), or NULL; positions past an item's length are
   not written. acts/alphas/betas: up to 3 activations (f, g, h) with their parameters. clip <= 0: none.
   ws: (G + 2) * H floats. Returns 0. */
int inferd_rnn_dir(int kind, int seq, int batch, int H, const float* xw, long long xw_ts, long long xw_bs,
                   const float* rt, const float* rb, const float* peep, const int* lens, int reverse, float* h,
                   float* c, float* y, long long y_ts, long long y_bs, const int* acts, const float* alphas,
                   const float* betas, float clip, int input_forget, int lbr, float* ws);
/* Both directions of a bidirectional layer as one pool job (a task per direction, on up to max_threads threads,
   0 = all): direction d (1 = reversed) is inferd_rnn_dir on xw + d*xw_ds, rt + d*H*G*H, rb + d*G*H, peep +
   d*3H (peep may be NULL), h and c + d*batch*H, y + d*y_ds (y may be NULL), acts/alphas/betas + 3d and
   ws + d*(G+2)*H. Returns 0. */
int inferd_rnn_bidir(int kind, int seq, int batch, int H, const float* xw, long long xw_ts, long long xw_bs,
                     long long xw_ds, const float* rt, const float* rb, const float* peep, const int* lens, float* h,
                     float* c, float* y, long long y_ts, long long y_bs, long long y_ds, const int* acts,
                     const float* alphas, const float* betas, float clip, int input_forget, int lbr, float* ws,
                     int max_threads);

/* ---- detection post-processing (detect.c) ---- */
/* Greedy non-maximum suppression with onnxruntime's rules. boxes: (B, N, 4), [y1, x1, y2, x2] (corners in any
   order) or, with center, [xc, yc, w, h]; scores: (B, C, N). Per batch and class, boxes with score > score_thr
   (every box when !has_score_thr) in descending score order (ties: lower index first) are kept unless their IoU
   with a box already kept exceeds iou_thr, at most max_out per class. Writes (b, c, box) triples to out in batch,
   class, selection order. Returns how many, -1 when more than cap would be written (nothing past cap is), -2 if
   out of memory. */
long long inferd_nms(const float* boxes, const float* scores, int B, int C, int N, int center, long long max_out,
                     float iou_thr, float score_thr, int has_score_thr, long long* out, long long cap);
/* RoiAlign as onnxruntime computes it: x (N, C, H, W); rois (R, 4) [x1, y1, x2, y2]; batch (R) indices into N
   (checked by the caller); y (R, C, OH, OW). sampling 0: ceil(roi size / output size) samples per bin; half_pixel
   shifts by -0.5 (opset 16's default) and lets a roi be smaller than one pixel; mode_max takes the max of the
   weighted corner values. Returns 0, or -1 if out of memory. */
int inferd_roi_align(const float* x, int N, int C, int H, int W, const float* rois, const long long* batch, int R,
                     int OH, int OW, int sampling, float scale, int half_pixel, int mode_max, float* y);
/* The top k of each of `rows` rows of n floats (k <= n): values and int64 column indices, descending
   (largest) or ascending, ties to the lower index, NaN ranks above every number for largest (below, else).
   Returns 0, or -1 if out of memory. */
int inferd_topk(const float* x, long long rows, long long n, long long k, int largest, float* vals, long long* idx);
/* ---- int8 GEMM and convolution (int8.c): int32 accumulation, requantised in the store ----
   y = clamp(rint(float(sum_k (x - zx) w + bias[n]) * mult[n]) + zy, lo, hi); w signed 8-bit, zero point 0;
   x and y int8 (signed = 1) or uint8 (0). */
/* Bytes of packed weights for N output channels of K taps. */
long long inferd_q8_packed_size(int N, int K);
/* Pack w (N x K, row-major) into wp (inferd_q8_packed_size bytes); wsum[n] = sum_k w[n][k]. */
void inferd_q8_pack(const signed char* w, int N, int K, signed char* wp, int* wsum);
/* Micro-kernel: 0 portable C, 1 VNNI (x86-64 AVX-512) or sdot (aarch64), 2 VNNI plus AMX tiles for convolutions and
   GEMMs (x86-64 Linux); set_isa(-1) picks the best the CPU has (a level it lacks gives the best below it: on an x86
   CPU with AVX2 and no AVX-512 VNNI the AVX2 kernels, reported as 3; set_isa(0) is always the portable C). Returns
   what is in use, as inferd_q8_isa reports it. */
int inferd_q8_set_isa(int level);
int inferd_q8_isa(void);
/* Tests: 1 keeps the int8 depthwise rows (at AVX2), 8-bit MaxPool, QLinearAdd and byte-table lookups off AVX-512
   on a CPU that has it; -1 the best. */
int inferd_q8_cap_avx512(int cap);
/* Tests and A/B runs: 0 stages every int8 conv's whole input before its tasks, 1 (the default) lets a 1x1,
   stride-1, unpadded conv's tasks stage their own blocks of pixels. Returns the previous setting. */
int inferd_q8_set_self_stage(int on);
/* Tests and A/B runs: 0 keeps the int8 depthwise window kernel (small maps, on VNNI with VBMI) off, 1 (the
   default) on. Returns the previous setting. */
int inferd_q8_set_dw_window(int on);
/* Tests and A/B runs: 0 keeps the int8 depthwise kernel of 4 output rows at a time (maps wider than 16, VNNI with
   VBMI) off, 1 (the default) on. Returns the previous setting. */
int inferd_q8_set_dw_rows(int on);
/* Y = X W^T: x (M x K, row pitch ldx bytes); y element (m, n) at y + m*ysm + n*ysn. bias may be NULL.
   Returns 0, or -1 if out of memory. */
int inferd_q8_gemm(const void* x, int x_signed, int zx, long long ldx, int M, int K, const signed char* wp,
                   const int* wsum, int N, const int* bias, const float* mult, int zy, int lo, int hi, void* y,
                   int y_signed, long long ysm, long long ysn, int max_threads);
/* Bytes of conv-packed weights w (N, C, taps = kh*kw), and the packing (groups of 4 channels at one tap, channels
   padded to 4; mode 0: rows of channels, N padded to 6; mode 1: panels of 32 channels; mode 2: rows of channels
   with the reduction ordered tap-major, groups per tap padded by at most 15% to whole AMX blocks, N padded to 16
   and to 6); wsum[n] = the sum of row n's weights. Any mode runs on any CPU (mode 2 without AMX: mode 0's
   kernels). */
long long inferd_q8_conv_packed_size(int N, int C, int taps, int mode);
void inferd_q8_conv_pack(const signed char* w, int N, int C, int taps, int mode, signed char* wp, int* wsum);
/* The packing (and kernel) inferd_q8_conv2d runs fastest with for this geometry on this CPU: 0, 1 or 2. */
int inferd_q8_conv_mode(int C, int N, int kh, int kw, int sw, int dw, int OH, int OW);
/* Convolution of one image x (C, H, W) with w (N, C, kh*kw) packed in `mode` into y (N, OH, OW); padding reads zx. */
int inferd_q8_conv2d(const void* x, int x_signed, int zx, int C, int H, int W, const signed char* wp, const int* wsum,
                     int N, int kh, int kw, int sh, int sw, int dh, int dw, int pt, int pl, int OH, int OW,
                     const int* bias, const float* mult, int zy, int lo, int hi, void* y, int y_signed, int mode,
                     int max_threads);
/* Depthwise convolution (channel multiplier 1) of one image: w (C, kh, kw) unpacked. */
int inferd_q8_dwconv2d(const void* x, int x_signed, int zx, int C, int H, int W, const signed char* w, int kh, int kw,
                       int sh, int sw, int dh, int dw, int pt, int pl, int OH, int OW, const int* bias,
                       const float* mult, int zy, int lo, int hi, void* y, int y_signed, int max_threads);
/* y = clamp(rint((a - za) ra + (b - zb) rb + zc), lo, hi) over n elements of same-shaped a, b (QLinearAdd). */
void inferd_q8_add(const void* a, int a_signed, int za, float ra, const void* b, int b_signed, int zb, float rb, float zc,
                   int lo, int hi, void* y, long long n, int max_threads);
/* QLinearMul: y = clamp(rint((a - za)(b - zb) m + zc), lo, hi); b of a's shape, or one value per row of inner
   elements (b_row). rows * inner elements. */
void inferd_q8_mul(const void* a, int a_signed, int za, const void* b, int b_signed, int zb, long long rows,
                   long long inner, int b_row, float m, float zc, int lo, int hi, void* y, int max_threads);
/* QuantizeLinear per tensor: y[i] = saturate(rint(x[i] / scale) + zp) to [lo, hi], as int8/uint8 bytes. */
void inferd_q8_quantize(const float* x, float scale, int zp, int lo, int hi, void* y, long long n, int max_threads);
/* DequantizeLinear per tensor, 8-bit x: y[i] = float(x[i] - zp) * scale. */
void inferd_q8_dequantize(const void* x, int x_signed, int zp, float scale, float* y, long long n, int max_threads);
/* QLinearGlobalAveragePool, channels first: y[r] = saturate(rint((sum of row r - zx*hw) * m) + zy), rows of hw. */
void inferd_q8_gap(const void* x, int x_signed, int zx, long long rows, long long hw, float m, int zy, int lo, int hi,
                   void* y, int max_threads);
/* y[i] = table[x[i]] over n bytes, or a copy where table is NULL (QLinearConcat's parts). */
void inferd_q8_map(const void* x, const unsigned char* table, void* y, long long n, int max_threads);
/* QLinearConcat of n parts one after another in y: part j (at[j+1] - at[j] bytes at xs[j]) copied, or mapped
   through tables[j] where that is not NULL. */
void inferd_q8_concat(int n, const void* const* xs, const unsigned char* const* tables, const long long* at, void* y,
                      int max_threads);
/* 8-bit MaxPool over planes of H x W (NCHW): taps in the padding skipped; 0 or -1 (out of memory). */
int inferd_q8_maxpool2d(const void* x, int x_signed, long long planes, int H, int W, int kh, int kw, int sh, int sw,
                        int dh, int dw, int pt, int pl, int OH, int OW, void* y, int max_threads);
/* Convolution on channel-blocked tensors (nchwc.c): x [cin_blocks][H][W][16], y [cout_blocks][OH][OW][16], res
   (NULL or y's shape) added before the activation; w packed as nchwc.c says; any KH x KW, stride, padding
   (top/left given, bottom/right implied by OH/OW); dilation 1, one group. 0, or -1 for bad arguments. */
int inferd_nchwc_conv(const float* x, int cin_blocks, int H, int W, const float* w, int cout_blocks, int KH, int KW,
                      int SH, int SW, int pad_top, int pad_left, int OH, int OW, const float* bias, const float* res,
                      float* y, int act, float p0, float p1);
/* inferd_nchwc_conv with the channel counts of the input and the output (cin, cout; the last block of each holds
   the count % 16 where not 0): the tiles skip the input's padding lanes, and where a vector is half a block the
   pointwise tiles compute only the real half of a last output block of 8 or fewer (its padding lanes zeros). */
int inferd_nchwc_conv_ch(const float* x, int cin, int H, int W, const float* w, int cout, int KH, int KW, int SH,
                         int SW, int pad_top, int pad_left, int OH, int OW, const float* bias, const float* res,
                         float* y, int act, float p0, float p1);
/* Output pixels of a row the current ISA's blocked tile computes at once. */
/* The same conv from an NCHW input x [cin][H][W] (a stem: an image's few channels) to a blocked y; w packed with
   blocks of one input channel: [group][cin][kh][kw][nbg * 16]. */
int inferd_nchwc_conv_nchw(const float* x, int cin, int H, int W, const float* w, int cout_blocks, int KH, int KW,
                           int SH, int SW, int pad_top, int pad_left, int OH, int OW, const float* bias,
                           const float* res, float* y, int act, float p0, float p1);
/* A grouped conv as groups of whole blocks (see nchwc.c): output block b reads input blocks [b / go * gi, + gi);
   cout's blocks a multiple of go and cin's blocks (cout's / go) * gi; w packed as inferd_nchwc_conv's with gi * 16
   input channels (zero weights between the conv's own groups). 0, or -1 for bad arguments. */
int inferd_nchwc_conv_grouped(const float* x, int cin, int H, int W, const float* w, int cout, int KH, int KW,
                              int SH, int SW, int pad_top, int pad_left, int OH, int OW, int gi, int go,
                              const float* bias, const float* res, float* y, int act, float p0, float p1);
/* A dilated conv, stride 1, pads whole multiples of the dilation (DH, DW), dense; channel counts as in
   inferd_nchwc_conv_ch. 0, -1 (arguments), -2 (out of memory). */
int inferd_nchwc_conv_dilated(const float* x, int cin, int H, int W, const float* w, int cout, int KH, int KW, int DH,
                              int DW, int pad_top, int pad_left, int OH, int OW, const float* bias, const float* res,
                              float* y, int act, float p0, float p1);
/* Bytes a blocked conv of this geometry allocates while it runs (its padded or strided copy of the input): cin, cout
   in channels, cpb 16 (blocked input) or 1 (NCHW), DH, DW the dilation (1 for none) */
long long inferd_nchwc_scratch_bytes(int cin, int cpb, int H, int W, int cout, int KH, int KW, int SH, int SW,
                                     int pad_top, int pad_left, int OH, int OW, int DH, int DW);
int inferd_nchwc_tile_pixels(void);
/* Output blocks per group of packed conv weights (the current ISA's tiles: 4 on AVX-512, 1 elsewhere); the packing
   (ops/conv_nchwc.py) must use it. */
int inferd_nchwc_group_blocks(void);
/* Depthwise conv (one group per channel, multiplier 1) on blocked tensors x [blocks][H][W][16] -> y [blocks][OH]
   [OW][16], w [blocks][KH][KW][16]; res, bias, act as inferd_nchwc_conv. 0, or -1 for bad arguments. */
int inferd_nchwc_dwconv(const float* x, int blocks, int H, int W, const float* w, int KH, int KW, int SH, int SW,
                        int pad_top, int pad_left, int OH, int OW, const float* bias, const float* res, float* y,
                        int act, float p0, float p1);
/* MaxPool (dilation 1; taps in the padding skipped, a NaN wins) on blocked tensors. 0, or -1. */
int inferd_nchwc_maxpool(const float* x, int blocks, int H, int W, int KH, int KW, int SH, int SW, int pad_top,
                         int pad_left, int OH, int OW, float* y);
/* n images of c planes of hw floats (NCHW) to blocked ([n][ceil(c / 16)][hw][16], the padding lanes of a last
   partial block zero) where to_blocked, else back (the padding lanes dropped). 0, or -1. */
int inferd_nchwc_reorder(const float* x, long long n, long long c, long long hw, float* y, int to_blocked);
/* A squeeze-excitation's two passes on n blocked images of c channels ([n][ceil(c / 16)][hw][16]): the mean of
   each channel into y [n][c]; each pixel times its channel's scale s [img * s_stride + channel] (s_stride 0: one
   scale vector for every image) into y (x's shape, the padding lanes zero). 0, or -1. */
int inferd_nchwc_gap(const float* x, long long n, long long c, long long hw, float* y);
int inferd_nchwc_scale(const float* x, long long n, long long c, long long hw, const float* s, long long s_stride,
                       float* y);
/* inferd_nchwc_scale, then times ``mult`` and activation ``act`` (an activation code with p0, p1; one that keeps
   zero at zero, or the padding lanes stop being zero): NF-Nets' act(gain * se(x)) in one pass. 0, or -1. */
int inferd_nchwc_scale_act(const float* x, long long n, long long c, long long hw, const float* s, long long s_stride,
                           float mult, int act, float p0, float p1, float* y);

/* The streaming runtime's loaders (native/stream.c). A piece: span bytes at arena address dst read from file_off
   (need of them data, the rest block padding) once step dep has run (-1: at once); unit: the streamed layer it
   belongs to. Pieces and blobs grouped by unit, units in order (pieces within a unit in dependency order). A
   blob: size bytes at addr whose hash must equal sum once all its unit's pieces are in. */
typedef struct {
    long long file_off;
    long long span;
    long long need;
    unsigned long long dst;
    int dep;
    int unit;
} inferd_stream_piece;
typedef struct {
    unsigned long long addr;
    long long size;
    unsigned long long sum;
    int unit;
    int pad;
} inferd_stream_blob;
typedef unsigned long long (*inferd_hash_fn)(const void* data, unsigned long len);
typedef struct inferd_stream inferd_stream;
enum inferd_stream_error {
    INFERD_STREAM_IO = 1,
    INFERD_STREAM_SHORT = 2,
    INFERD_STREAM_CHECKSUM = 3,
    INFERD_STREAM_GAP = 4,
    INFERD_STREAM_ABORTED = 5,
    INFERD_STREAM_ARG = 6
};
/* the loaders' ``nice`` that puts them in the idle scheduling class (SCHED_IDLE) rather than at a niceness */
enum inferd_stream_sched { INFERD_STREAM_IDLE = 100 };
/* fd: the store opened buffered; dfd: with O_DIRECT (-1: none); drop: after a buffered read, drop the pages it
   cached; nice: the loaders' niceness (or INFERD_STREAM_IDLE); pool_idle: the native pool's workers, spinning
   between two jobs, read pieces too (one read of up to 64 KiB at a time); hash: NULL, the caller verifies; gap: a
   block-aligned scratch buffer of gap_size bytes for the bytes between joined pieces. NULL for bad arguments or no
   memory. */
inferd_stream* inferd_stream_new(int fd, int dfd, int drop, int nice, int pool_idle,
                                 const inferd_stream_piece* pieces, int npieces, int nunits,
                                 const inferd_stream_blob* blobs, int nblobs, inferd_hash_fn hash, void* gap,
                                 long long gap_size, long long run_max, long long gap_max);
void inferd_stream_free(inferd_stream* s);
/* A run starts: nloaders threads read ahead (fewer if threads could not be started: the number returned). */
int inferd_stream_begin(inferd_stream* s, int nloaders);
/* The compute thread ran step ``step``. */
void inferd_stream_done(inferd_stream* s, int step);
/* Until unit's weights are in and verified (steal: reading its untaken pieces itself): 0, or an error code. */
int inferd_stream_wait(inferd_stream* s, int unit, int steal);
/* The run is over (abort: after an error; returns once no loader touches the arena). */
void inferd_stream_end(inferd_stream* s, int abort);
/* d: read_s (wall time with a read in flight), verify_s; i: reads, bytes, error, errno, piece, blob, got, need,
   loaders inside a run's loop, loader threads, reads made by pool workers between jobs. */
void inferd_stream_stats(inferd_stream* s, double* d, long long* i);

/* A run of bound kernel calls in one C call (steps.c): step i calls entry point `kind` (inferd_steps_kind: by
   its name, with `sig` its argument letters, p pointer, i int, l long long, f float) on the nargs slots at a.
   Returns n when every step returned 0, else the index of the first that did not (it may have run in part; the
   ones after it did not run). */
typedef union {
    long long i;
    double f;
    void* p;
} inferd_arg;
typedef struct {
    int kind;
    int nargs;
    inferd_arg* a;
} inferd_step;
int inferd_steps_kind(const char* name, const char** sig);
int inferd_steps_run(const inferd_step* s, int n);
/* inferd_steps_run, writing after each step that ran the monotonic clock in seconds (CLOCK_MONOTONIC, which is
   Python's time.perf_counter on Linux) into t[i] (t NULL: no clock read; inferd_steps_run is that): a cold load's
   first run times each layer of the run of ready layers it executes in one call. */
int inferd_steps_run_timed(const inferd_step* s, int n, double* t);

/* mincore.c: resident pages of the file open as fd (size bytes) over nwin windows (page-aligned offs[i],
   lens[i] bytes), by mincore on one shared mapping; *looked: the pages looked at. -1 when it cannot be mapped or
   asked (*looked 0). */
long long inferd_resident_pages(int fd, long long size, const long long* offs, const long long* lens, int nwin,
                                long long* looked);
