/* metrics.c — counters behind GET /metrics, written in the Prometheus text format. Engine counters are the
 * worker's last snapshot, so reading them never races an evaluation. */
#include <string.h>
#include "server/srv_internal.h"

void metrics_init(srv_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

void metrics_free(srv_metrics *m) { pthread_mutex_destroy(&m->mu); }

void metrics_count_status(srv_metrics *m, int status) {
    pthread_mutex_lock(&m->mu);
    int i = 0;
    while (i < SRV_N_STATUS - 1 && m->status_code[i] && m->status_code[i] != status) i++;
    m->status_code[i] = m->status_code[i] ? m->status_code[i] : status;
    m->status_count[i]++;
    pthread_mutex_unlock(&m->mu);
}

static void metric(text_buf *o, const char *name, const char *type, const char *help, double v) {
    text_buf_printf(o, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

void metrics_text(srv *s, text_buf *o) {
    pthread_mutex_lock(&s->mu);
    int queued = s->n_queued, running = s->n_running;
    pthread_mutex_unlock(&s->mu);
    srv_metrics *m = &s->m;
    pthread_mutex_lock(&m->mu);
    text_buf_puts(o, "# HELP deltafin_requests_total HTTP requests answered, by status code.\n"
                     "# TYPE deltafin_requests_total counter\n");
    for (int i = 0; i < SRV_N_STATUS && m->status_code[i]; i++)
        text_buf_printf(o, "deltafin_requests_total{status=\"%d\"} %llu\n", m->status_code[i],
                        (unsigned long long)m->status_count[i]);
    metric(o, "deltafin_requests_cancelled_total", "counter", "Generations stopped because the client went away.",
           (double)m->requests_cancelled);
    metric(o, "deltafin_prompt_tokens_total", "counter", "Prompt tokens evaluated (prefill).",
           (double)m->prompt_tokens);
    metric(o, "deltafin_prompt_tokens_reused_total", "counter",
           "Prompt tokens skipped because the previous conversation state was reused.",
           (double)m->prompt_tokens_reused);
    metric(o, "deltafin_generated_tokens_total", "counter", "Tokens generated.", (double)m->generated_tokens);
    metric(o, "deltafin_prefill_seconds_total", "counter", "Time spent evaluating prompts.", m->prefill_s);
    metric(o, "deltafin_decode_seconds_total", "counter", "Time spent generating tokens.", m->decode_s);
    metric(o, "deltafin_seconds_per_token", "gauge", "Decode time per token of the last generation.",
           m->last_s_per_token);
    metric(o, "deltafin_decode_passes_total", "counter",
           "Verifier passes after the prompts, per answer (a pass shared by several answers counts for each).",
           (double)m->decode_passes);
    metric(o, "deltafin_drafted_tokens_total", "counter", "Tokens drafted by speculative decoding and verified.",
           (double)m->drafted);
    metric(o, "deltafin_accepted_tokens_total", "counter", "Drafted tokens the model kept.", (double)m->accepted);
    metric(o, "deltafin_time_to_first_token_seconds", "gauge",
           "Time from queueing to the first token of the last request (prefill or restored state).", m->last_ttft_s);
    metric(o, "deltafin_prompt_cache_restored_total", "counter", "Prompts whose prefix was restored from disk.",
           (double)m->prompt_cache_restored);
    metric(o, "deltafin_prompt_cache_saved_total", "counter", "Prompt states written to the disk cache.",
           (double)m->prompt_cache_saved);
    metric(o, "deltafin_connections_timed_out_total", "counter",
           "Connections closed because a request did not arrive within the read timeout.", (double)m->connections_timed_out);
    metric(o, "deltafin_connections_evicted_total", "counter",
           "Connections still waiting for their request, closed to make room for a new one over a connection limit.",
           (double)m->connections_evicted);
    metric(o, "deltafin_connections_refused_total", "counter",
           "New connections closed at once: over a connection limit while every other was being answered.",
           (double)m->connections_refused);
    metric(o, "deltafin_requests_waited_for_memory_total", "counter",
           "Requests held back while a slot was free because --slot-mem was full.", (double)m->requests_waited_for_memory);
    metric(o, "deltafin_expert_cache_hits_total", "counter", "Expert cache hits.", (double)m->engine.expert_hits);
    metric(o, "deltafin_expert_cache_misses_total", "counter", "Expert cache misses.",
           (double)m->engine.expert_misses);
    metric(o, "deltafin_expert_reads_total", "counter", "Expert reads issued (each a whole expert).",
           (double)m->engine.expert_loads);
    metric(o, "deltafin_prefill_passes_total", "counter", "Forward passes that evaluated prompt tokens.",
           (double)m->prefill_passes);
    metric(o, "deltafin_disk_read_bytes_total", "counter", "Weight bytes read from disk.",
           (double)m->engine.disk_bytes);
    metric(o, "deltafin_network_read_bytes_total", "counter", "Weight bytes read from the network.",
           (double)m->engine.net_bytes);
    pthread_mutex_unlock(&m->mu);
    metric(o, "deltafin_queue_depth", "gauge", "Requests waiting for the generation worker.", queued);
    metric(o, "deltafin_requests_running", "gauge", "Requests being answered in the conversation slots.", running);
    metric(o, "deltafin_slots", "gauge", "Conversation slots decoded together (--parallel).", s->n_slots);
}
