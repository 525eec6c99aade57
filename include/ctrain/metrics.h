/* ctrain/metrics.h — training metrics as JSONL, as TensorBoard event files, and as an SVG
 * chart, so a run can be inspected with jq, with TensorBoard, or with nothing but a browser.
 *
 *   ct_metrics *m;
 *   if (ct_metrics_open("output/metrics", &m) != CT_OK) { puts(ct_last_error()); return 1; }
 *   for (int64_t step = 1; step <= steps; step++) {
 *       ...
 *       ct_metrics_scalar(m, "train/loss", step, loss);
 *       ct_metrics_scalar(m, "train/lr", step, lr);
 *   }
 *   ct_metrics_scalar(m, "eval/accuracy", steps, acc);
 *   ct_metrics_flush(m);                       // both files on disk (fsync)
 *   ct_metrics_write_svg(m, "output/metrics/metrics.svg", "cnn on fashion-mnist");
 *   ct_metrics_close(m);
 *
 *   tensorboard --logdir output/metrics        // reads events.out.tfevents.*
 *
 * Files in <dir>:
 *  - metrics.jsonl (appended to, so a resumed run continues the same file): one object per
 *    step, {"step": 100, "time": 1718000000.123, "train/loss": 0.41, "train/lr": 0.001};
 *    tags recorded for the same step share a line, written when a different step starts or
 *    on flush/close (a tag recorded for that step after a flush starts a second line).
 *    NaN and infinities are written as null.
 *  - events.out.tfevents.<unix time>.<hostname>.<pid>.ctrain: TFRecord-framed Event protos,
 *    first {file_version: "brain.Event:2"}, then one Event{wall_time, step, summary{value{tag,
 *    simple_value}}} per scalar (values stored as float32, as TensorBoard does).
 *
 * Not thread-safe: one writer (rank 0's training loop). Every point stays in memory for the
 * chart (16 bytes each); a tag with more than 10,000 points is drawn as the min and max of
 * each of 1,000 step buckets, so the SVG stays small and spikes stay visible.
 */
#ifndef CTRAIN_METRICS_H
#define CTRAIN_METRICS_H

#include "ctrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Longest tag accepted, in bytes. Tags are non-empty UTF-8 without control characters. */
#define CT_METRICS_MAX_TAG 256

typedef struct ct_metrics ct_metrics;

/* Creates dir (and its parents) if needed; opens <dir>/metrics.jsonl for appending and a new
 * event file. CT_ERR_IO with the path in the message if either can't be created. */
ct_status ct_metrics_open(const char *dir, ct_metrics **out);

/* Record a scalar for a step, e.g. "train/loss", "train/lr", "train/samples_per_s",
 * "eval/accuracy", "eval/loss". The same tag twice for one step: the JSONL line and the chart
 * keep the last value, the event file has both (TensorBoard shows the last). A bad tag is
 * CT_ERR_INVALID; a failed write CT_ERR_IO naming the file (the point is still kept). */
ct_status ct_metrics_scalar(ct_metrics *m, const char *tag, int64_t step, double value);

/* Write the pending JSONL line, flush and fsync both files. */
ct_status ct_metrics_flush(ct_metrics *m);

/* Write an SVG chart of every tag recorded so far: one panel per metric name (the part after
 * the last '/': "train/loss" and "eval/loss" share the "loss" panel, "eval/accuracy" gets its
 * own), panels in order of first appearance, step on x, one polyline per tag with a legend
 * that also shows its last value. Self-contained (no scripts, fonts or links); written to a
 * temporary name, fsynced and renamed over path. */
ct_status ct_metrics_write_svg(const ct_metrics *m, const char *path, const char *title);

/* Flush (failures are logged as warnings), close the files, free m. NULL is a no-op. */
void ct_metrics_close(ct_metrics *m);

#ifdef __cplusplus
}
#endif
#endif
