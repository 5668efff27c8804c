/* The eval callback that copies a llama.cpp forward's layer taps for verispec's heads.
 *
 * llama.cpp asks its eval callback about every node of a forward's graph (936 for the default
 * model) before computing it. Answered in Python, the asking alone costs about 0.9 ms a token.
 * This callback compares the node's name with the wanted ones in C and, once a wanted node is
 * computed, copies its bytes after what this forward already copied of that tap (a forward of
 * several ubatches computes the node once per ubatch), without calling into Python. */
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

struct ggml_tensor;

#define VERISPEC_MAX_TAPS 64
#define VERISPEC_NAME_BYTES 64 /* ggml's GGML_MAX_NAME */

struct verispec_taps {
    const char * (*name)(const struct ggml_tensor *); /* ggml_get_name */
    void * (*data)(const struct ggml_tensor *);       /* ggml_get_data: a CPU tensor's bytes */
    size_t (*nbytes)(const struct ggml_tensor *);     /* ggml_nbytes */
    int count;                                        /* wanted names; 0 answers no to every node */
    char names[VERISPEC_MAX_TAPS][VERISPEC_NAME_BYTES];
    char * dest[VERISPEC_MAX_TAPS];                   /* where tap i's bytes go */
    size_t capacity[VERISPEC_MAX_TAPS];               /* bytes dest[i] holds */
    size_t copied[VERISPEC_MAX_TAPS];                 /* bytes copied this forward; the caller zeroes them */
    int overflow;                                     /* set where a tap outgrew its buffer (the forward stops) */
};

bool verispec_observe(struct ggml_tensor * tensor, bool ask, void * user_data) {
    struct verispec_taps * taps = user_data;
    if (taps->count == 0) {
        return false;
    }
    const char * name = taps->name(tensor);
    for (int i = 0; i < taps->count; i++) {
        if (strncmp(name, taps->names[i], VERISPEC_NAME_BYTES) == 0) {
            if (ask) {
                return true;
            }
            size_t n = taps->nbytes(tensor);
            if (n > taps->capacity[i] - taps->copied[i]) {
                taps->overflow = 1;
                return false;
            }
            memcpy(taps->dest[i] + taps->copied[i], taps->data(tensor), n);
            taps->copied[i] += n;
            return true;
        }
    }
    return false;
}
