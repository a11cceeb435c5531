/* test_config.c — config.json parsing: both families and key spellings, the layer schedule from the 1-based
 * lists, and clear errors naming the key for configs the forward pass could not trust. */
#include <string.h>
#include "test.h"
#include "model/config.h"

#define BASE "\"vocab_size\":64,\"hidden_size\":16,\"num_hidden_layers\":4,\"intermediate_size\":32," \
             "\"num_attention_heads\":2,\"kv_lora_rank\":8,\"qk_nope_head_dim\":4,\"qk_rope_head_dim\":2," \
             "\"v_head_dim\":4,\"num_experts\":8,\"num_experts_per_token\":2,\"moe_intermediate_size\":8," \
             "\"first_k_dense_replace\":1"
#define LAC(k, f) "\"linear_attn_config\":{\"num_heads\":2,\"head_dim\":4,\"kda_layers\":" k ",\"full_attn_layers\":" f "}"

static int parse(const char *json, df_config *c, df_error *err) {
    memset(err, 0, sizeof *err);
    return config_parse(c, json, "cfg.json", err);
}

static void expect_error(const char *json, const char *needle, const char *name) {
    df_config c;
    df_error err;
    int rc = parse(json, &c, &err);
    CHECK(rc != 0 && strstr(err.msg, needle) && strstr(err.msg, "cfg.json"), "%s: %s", name, err.msg);
    if (!rc) config_free(&c);
}

int main(void) {
    df_config c;
    df_error err;
    int rc = parse("{\"model_type\":\"kimi_linear\"," BASE "," LAC("[1,2,3]", "[4]") "}", &c, &err);
    CHECK(!rc && !c.is_k3 && c.mixer[0] == MIXER_KDA && c.mixer[3] == MIXER_MLA && c.ffn[0] == FFN_DENSE &&
          c.ffn[1] == FFN_MOE && c.renorm == 1 && c.n_group == 1, "kimi_linear schedule from the 1-based lists");
    if (!rc) config_free(&c);

    rc = parse("{\"model_type\":\"kimi_k3\",\"text_config\":{" BASE ",\"hidden_act\":\"situ\","
               "\"activation_situ_linear_beta\":25,\"attn_res_block_size\":2,\"routed_expert_hidden_size\":8,"
               "\"num_local_experts\":8,\"num_experts_per_tok\":2,\"norm_topk_prob\":false,"
               "\"linear_attn_config\":{\"num_heads\":2,\"head_dim\":4,\"kda_layers\":[1,3],"
               "\"full_attn_layers\":[2,4],\"use_full_rank_gate\":true,\"gate_lower_bound\":-5.0}}}", &c, &err);
    CHECK(!rc && c.is_k3 && c.use_situ && c.situ_lin_beta == 25.0f && c.attn_res_block == 2 && c.latent_dim == 8 &&
          c.full_rank_gate && c.has_lower_bound && c.lower_bound == -5.0f && c.renorm == 0 && c.mixer[1] == MIXER_MLA,
          "kimi_k3 text_config with K3 keys and transformers' spellings");
    if (!rc) config_free(&c);

    expect_error("{\"model_type\":\"llama\"}", "llama", "unknown model_type is refused");
    expect_error("{\"model_type\":\"kimi_linear\"", "bad JSON", "truncated JSON");
    expect_error("{\"model_type\":\"kimi_linear\"," BASE "}", "linear_attn_config", "missing schedule");
    expect_error("{\"model_type\":\"kimi_linear\"," BASE "," LAC("[1,2,3]", "[3,4]") "}", "listed twice",
                 "a layer in both lists");
    expect_error("{\"model_type\":\"kimi_linear\"," BASE "," LAC("[1,2]", "[4]") "}", "layer 3",
                 "a layer in neither list");
    expect_error("{\"model_type\":\"kimi_linear\"," BASE "," LAC("[1,2,3]", "[5]") "}", "out of range",
                 "a layer past the end");
    expect_error("{\"model_type\":\"kimi_linear\",\"hidden_act\":\"gelu\"," BASE "," LAC("[1,2,3]", "[4]") "}",
                 "gelu", "unsupported activation");
    expect_error("{\"model_type\":\"kimi_linear\",\"vocab_size\":\"big\"}", "vocab_size\" must be an integer", "wrong type");
    expect_error("{\"model_type\":\"kimi_linear\"," BASE ",\"num_expert_group\":3," LAC("[1,2,3]", "[4]") "}",
                 "grouped routing", "experts not divisible by groups");
    expect_error("{\"model_type\":\"kimi_linear\"," BASE ",\"num_experts_per_token\":9," LAC("[1,2,3]", "[4]") "}",
                 "MoE sizes", "top-k larger than the experts");
    expect_error("{\"model_type\":\"kimi_k3\"}", "text_config", "K3 without text_config");
    TEST_EXIT();
}
