/* contract.c: the descriptions of contract.h, one per structure of runtime/ddp_abi.h,
 * expanded from each structure's field list. */
#include "contract.h"

#define DESC_I64(T, name) {#name, FIELD_I64, offsetof(T, name), 1, NULL, 0},
#define DESC_U64(T, name) {#name, FIELD_U64, offsetof(T, name), 1, NULL, 0},
#define DESC_F64(T, name) {#name, FIELD_F64, offsetof(T, name), 1, NULL, 0},
#define DESC_STR(T, name) {#name, FIELD_STR, offsetof(T, name), 1, NULL, 0},
#define DESC_I64S(T, name, n) {#name, FIELD_I64S, offsetof(T, name), n, NULL, 0},
#define DESC_STRS(T, name, n) {#name, FIELD_STRS, offsetof(T, name), n, NULL, 0},
#define DESC_SUB(T, type, name) {#name, FIELD_SUB, offsetof(T, name), 1, &contract_##type, 0},
#define DESC_SUBS(T, type, name, n) {#name, FIELD_SUBS, offsetof(T, name), n, &contract_##type, 0},
#define DESC_REFS(T, type, name, count) {#name, FIELD_REFS, offsetof(T, name), 0, &contract_##type, offsetof(T, count)},
#define DESC_I64REFS(T, name, count) {#name, FIELD_I64REFS, offsetof(T, name), 0, NULL, offsetof(T, count)},
#define DESC_STRREFS(T, name, count) {#name, FIELD_STRREFS, offsetof(T, name), 0, NULL, offsetof(T, count)},
#define DESC_FNS(T, name, wide) {#name, FIELD_FNS, offsetof(T, name), wide, NULL, 0},

#define DESCRIBE(T)                                                                                          \
    static const ContractField fields_##T[] = {DDP_FIELDS_##T(DESC, T)};                                     \
    const ContractType contract_##T = {#T, sizeof(T), fields_##T, (int)(sizeof fields_##T / sizeof fields_##T[0])};
CONTRACT_TYPES(DESCRIBE)
